//! Preprocessing before rendering (DSML.md §1), in the reference's order:
//! 1. images: image blocks become `<｜deepseek_image｜>` and their records are collected; list
//!    content is joined to text; a literal placeholder in text is an error;
//! 2. `merge_tool_messages`: tool messages become `<tool_result>` blocks of a user turn, and
//!    consecutive user turns merge unless the earlier one has a task;
//! 3. `sort_tool_results_by_call_order`.
//!
//! (Step 4, drop_thinking, is a rendering rule here: see `render`.)

use super::message::*;
use super::segments::{Control, Prompt};
use super::{json_py, Error, PyException};
use std::collections::HashMap;

const PLACEHOLDER: &str = "<｜deepseek_image｜>";

/// A user-turn block after preprocessing.
#[derive(Clone, Debug)]
pub(crate) enum TurnBlock {
    /// Text, or an image placeholder (a text block holding the placeholder in the reference).
    Text(Prompt),
    ToolResult {
        tool_use_id: Option<String>,
        content: Prompt,
    },
    Unsupported(Option<String>),
}

/// A message after preprocessing: what `render_message` sees.
#[derive(Clone, Debug)]
pub(crate) struct Turn<'a> {
    pub role: Role,
    /// The message's `content` as text (list content joined); `None` if absent.
    pub text: Option<Prompt>,
    /// A user turn's `content_blocks`.
    pub blocks: Vec<TurnBlock>,
    /// The message the turn came from (`None` for a user turn made from tool messages).
    pub source: Option<&'a Message>,
    /// The first message of the turn, for errors (`messages[3]`).
    pub path: String,
}

impl<'a> Turn<'a> {
    pub fn task(&self) -> Option<Task> {
        self.source.and_then(|m| m.task)
    }
    pub fn has_tools(&self) -> bool {
        self.source.is_some_and(|m| !m.tools.is_empty())
    }
}

/// A message's processed content: its text, and its blocks when the content was a list.
type ProcessedContent = (Option<Prompt>, Option<Vec<TurnBlock>>);

/// Step 1 for one list of messages (`path` is `messages` or `context`): returns the processed
/// contents and the image records in order.
fn process_images(
    messages: &[Message],
    path: &str,
) -> Result<(Vec<ProcessedContent>, Vec<serde_json::Value>), Error> {
    let mut out = Vec::with_capacity(messages.len());
    let mut images = Vec::new();
    for (i, msg) in messages.iter().enumerate() {
        let mpath = format!("{path}[{i}]");
        if let Some(Content::Text(text)) = &msg.content {
            if text.contains(PLACEHOLDER) {
                return Err(Error::reference(
                    PyException::ValueError,
                    format!(
                        "Message content contains image special token '{PLACEHOLDER}'. Images should be provided as image content blocks."
                    ),
                )
                .at(&format!("{mpath}.content")));
            }
        }
        if msg
            .reasoning_content
            .as_deref()
            .is_some_and(|r| r.contains(PLACEHOLDER))
        {
            return Err(Error::reference(
                PyException::ValueError,
                format!("reasoning_content contains image special token '{PLACEHOLDER}'"),
            )
            .at(&format!("{mpath}.reasoning_content")));
        }
        match &msg.content {
            None => out.push((None, None)),
            Some(Content::Text(t)) => out.push((Some(Prompt::from(t.as_str())), None)),
            Some(Content::Blocks(blocks)) => {
                let processed = process_blocks(blocks, &format!("{mpath}.content"), &mut images)?;
                // The message text: its text blocks (placeholders included) joined by "\n\n".
                let texts: Vec<Prompt> = processed
                    .iter()
                    .filter_map(|b| match b {
                        TurnBlock::Text(p) => Some(p.clone()),
                        _ => None,
                    })
                    .collect();
                out.push((Some(Prompt::join(texts, "\n\n")), Some(processed)));
            }
        }
    }
    Ok((out, images))
}

fn process_blocks(
    blocks: &[Block],
    path: &str,
    images: &mut Vec<serde_json::Value>,
) -> Result<Vec<TurnBlock>, Error> {
    let mut out = Vec::with_capacity(blocks.len());
    for (j, block) in blocks.iter().enumerate() {
        let bpath = format!("{path}[{j}]");
        out.push(match block {
            Block::Image(record) => {
                let has_source = ["source", "url", "data"]
                    .iter()
                    .any(|k| record.get(*k).is_some_and(json_py::truthy));
                if !has_source {
                    return Err(Error::reference(
                        PyException::ValueError,
                        "Image block does not contain a valid source",
                    )
                    .at(&bpath));
                }
                images.push(record.clone());
                let mut p = Prompt::new();
                p.push_control(Control::Image);
                TurnBlock::Text(p)
            }
            Block::Text(text) => {
                if text.contains(PLACEHOLDER) {
                    let head: String = text.chars().take(100).collect();
                    return Err(Error::reference(
                        PyException::ValueError,
                        format!(
                            "Text block contains image placeholder '{PLACEHOLDER}': '{head}'. Images should be separate content blocks."
                        ),
                    )
                    .at(&format!("{bpath}.text")));
                }
                TurnBlock::Text(Prompt::from(text.as_str()))
            }
            Block::ToolResult { tool_use_id, content } => {
                let content = match content {
                    // A string tool result is not scanned for placeholders (as in the reference).
                    ToolResultContent::Text(t) => Prompt::from(t.as_str()),
                    ToolResultContent::Blocks(inner) => {
                        let parts = process_blocks(inner, &format!("{bpath}.content"), images)?
                            .into_iter()
                            .map(|b| match b {
                                TurnBlock::Text(p) => p,
                                TurnBlock::ToolResult { .. } => Prompt::from("[Unsupported tool_result]"),
                                TurnBlock::Unsupported(t) => unsupported(t.as_deref()),
                            })
                            .collect();
                        Prompt::join(parts, "\n\n")
                    }
                };
                TurnBlock::ToolResult {
                    tool_use_id: tool_use_id.clone(),
                    content,
                }
            }
            Block::Unsupported(t) => TurnBlock::Unsupported(t.clone()),
        });
    }
    Ok(out)
}

/// `[Unsupported {type}]`; a missing type prints as Python's `None`.
pub(crate) fn unsupported(kind: Option<&str>) -> Prompt {
    Prompt::from(format!("[Unsupported {}]", kind.unwrap_or("None")).as_str())
}

/// Steps 1–2 for one list.
fn merge<'a>(
    messages: &'a [Message],
    path: &str,
) -> Result<(Vec<Turn<'a>>, Vec<serde_json::Value>), Error> {
    let (processed, images) = process_images(messages, path)?;
    let mut turns: Vec<Turn<'a>> = Vec::new();
    for (i, (msg, (text, blocks))) in messages.iter().zip(processed).enumerate() {
        let mpath = format!("{path}[{i}]");
        match msg.role {
            Role::Tool => {
                let block = TurnBlock::ToolResult {
                    tool_use_id: msg.tool_call_id.clone(),
                    content: text.unwrap_or_default(),
                };
                match turns.last_mut() {
                    Some(last) if last.role == Role::User => last.blocks.push(block),
                    _ => turns.push(Turn {
                        role: Role::User,
                        text: None,
                        blocks: vec![block],
                        source: None,
                        path: mpath,
                    }),
                }
            }
            Role::User => {
                let blocks = match blocks {
                    Some(b) => b,
                    None => vec![TurnBlock::Text(text.clone().unwrap_or_default())],
                };
                match turns.last_mut() {
                    Some(last) if last.role == Role::User && last.task().is_none() => {
                        last.blocks.extend(blocks)
                    }
                    _ => turns.push(Turn {
                        role: Role::User,
                        text,
                        blocks,
                        source: Some(msg),
                        path: mpath,
                    }),
                }
            }
            role => turns.push(Turn {
                role,
                text,
                blocks: Vec::new(),
                source: Some(msg),
                path: mpath,
            }),
        }
    }
    Ok((turns, images))
}

/// Step 3 over a sequence of turns (in place).
fn sort_tool_results(turns: &mut [Turn<'_>]) {
    let mut order: HashMap<&str, usize> = HashMap::new();
    for turn in turns.iter_mut() {
        match turn.role {
            Role::Assistant => {
                let calls = turn.source.map(|m| m.tool_calls.as_slice()).unwrap_or(&[]);
                if !calls.is_empty() {
                    order = HashMap::new();
                    for (idx, call) in calls.iter().enumerate() {
                        if let Some(id) = call.id.as_deref() {
                            order.insert(id, idx);
                        }
                    }
                }
            }
            Role::User => {
                let n_results = turn
                    .blocks
                    .iter()
                    .filter(|b| matches!(b, TurnBlock::ToolResult { .. }))
                    .count();
                if n_results > 1 && !order.is_empty() {
                    let key = |b: &TurnBlock| match b {
                        TurnBlock::ToolResult { tool_use_id, .. } => tool_use_id
                            .as_deref()
                            .and_then(|id| order.get(id).copied())
                            .unwrap_or(0),
                        _ => 0,
                    };
                    let mut results: Vec<TurnBlock> = turn
                        .blocks
                        .iter()
                        .filter(|b| matches!(b, TurnBlock::ToolResult { .. }))
                        .cloned()
                        .collect();
                    results.sort_by_key(key); // stable, like Python's sorted
                    let mut sorted = results.into_iter();
                    for block in turn.blocks.iter_mut() {
                        if matches!(block, TurnBlock::ToolResult { .. }) {
                            if let Some(next) = sorted.next() {
                                *block = next;
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
}

/// The preprocessed conversation: context turns followed by message turns.
pub(crate) struct Preprocessed<'a> {
    pub turns: Vec<Turn<'a>>,
    pub context_len: usize,
    pub images: Vec<serde_json::Value>,
}

pub(crate) fn preprocess(conversation: &Conversation) -> Result<Preprocessed<'_>, Error> {
    // The reference processes context images first (and discards their records).
    let (context, _) = merge(&conversation.context, "context")?;
    let (messages, images) = merge(&conversation.messages, "messages")?;
    let context_len = context.len();
    // The reference sorts context + messages together, then the context alone; the sort
    // state at any turn depends only on the turns before it, so one pass gives both.
    let mut full: Vec<Turn<'_>> = context.into_iter().chain(messages).collect();
    sort_tool_results(&mut full);
    Ok(Preprocessed {
        turns: full,
        context_len,
        images,
    })
}
