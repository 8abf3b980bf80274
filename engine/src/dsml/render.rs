//! The render grammar (DSML.md §2): a conversation becomes the exact string `encode_messages`
//! returns, built as [`Prompt`] segments. Renderer-authored control tokens are controls;
//! every byte that comes from the conversation (contents, names, arguments, schemas) is text.

use super::json_py::{self, LoadsError};
use super::message::*;
use super::preprocess::{preprocess, unsupported, Turn, TurnBlock};
use super::segments::{Control, Prompt};
use super::{Error, PyException};
use serde_json::{Map, Value};

/// The fixed tools preamble (DSML.md §2.3 part 1; 848 characters, sha256 `2ae2ff83…231d`).
pub const TOOLS_PREAMBLE: &str = "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by writing a \"<｜DSML｜ calls>\" block like the following:\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"$TOOL_NAME\">\n<｜DSML｜ parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜ parameter>\n...\n</｜DSML｜ invoke>\n<｜DSML｜ invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜ invoke>\n</｜DSML｜ calls>\n\nString parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n### Available Tool Schemas\n\n";
/// DSML.md §2.3 part 3.
pub const TOOLS_EPILOGUE: &str =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
/// DSML.md §2.2, system messages with `response_format`.
pub const RESPONSE_FORMAT_HEADER: &str =
    "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

fn effort_line(budget: u8) -> String {
    format!("Reasoning Effort: {budget} (range 1-100, the higher the value, the more thorough the reasoning)\n\n")
}

/// `encode_messages(messages, thinking_mode, context, drop_thinking, add_default_bos_token,
/// reasoning_effort)`.
pub fn render(conversation: &Conversation, options: &RenderOptions) -> Result<Prompt, Error> {
    let pre = preprocess(conversation)?;
    let renderer = Renderer::new(&pre.turns, options);
    let mut prompt = Prompt::new();
    if options.add_default_bos_token && pre.context_len == 0 {
        prompt.push_control(Control::Bos);
    }
    for index in pre.context_len..pre.turns.len() {
        prompt.append(renderer.turn(index)?);
    }
    prompt.images = pre.images;
    Ok(prompt)
}

/// `render_message(index, messages, …)`: one turn of the preprocessed conversation (the turn
/// index equals the message index unless tool or consecutive user messages were merged).
pub fn render_message(
    conversation: &Conversation,
    index: usize,
    options: &RenderOptions,
) -> Result<Prompt, Error> {
    let pre = preprocess(conversation)?;
    if index >= pre.turns.len() {
        return Err(Error::input(
            "index",
            format!("{index} is out of range for {} turns", pre.turns.len()),
        ));
    }
    Renderer::new(&pre.turns, options).turn(index)
}

/// The completion a model produces for an assistant message after an open header:
/// `{reasoning}</think>` (thinking mode) `{content}{tool calls}<｜end▁of▁sentence｜>`; the
/// inverse of [`super::parse`].
pub fn render_completion(message: &Message, mode: ThinkingMode) -> Result<Prompt, Error> {
    let conversation = Conversation {
        messages: vec![Message::new(Role::User, ""), message.clone()],
        context: Vec::new(),
    };
    let options = RenderOptions {
        thinking_mode: mode,
        ..RenderOptions::default()
    };
    render_message(&conversation, 1, &options)
}

struct Renderer<'t, 'a> {
    turns: &'t [Turn<'a>],
    options: &'t RenderOptions,
    thinking: bool,
    drop_thinking: bool,
    last_user: i64,
}

impl<'t, 'a> Renderer<'t, 'a> {
    fn new(turns: &'t [Turn<'a>], options: &'t RenderOptions) -> Self {
        // Any `tools` key anywhere forces drop_thinking off (DSML.md §1 step 4).
        let drop_thinking = options.drop_thinking && !turns.iter().any(Turn::has_tools);
        let last_user = turns
            .iter()
            .enumerate()
            .rev()
            .find(|(i, t)| t.role == Role::User || (t.role == Role::System && *i > 0))
            .map_or(-1, |(i, _)| i as i64);
        Renderer {
            turns,
            options,
            thinking: options.thinking_mode == ThinkingMode::Thinking,
            drop_thinking,
            last_user,
        }
    }

    fn turn(&self, index: usize) -> Result<Prompt, Error> {
        let turn = &self.turns[index];
        let mut p = Prompt::new();
        // Index-0 prefix (§2.1).
        if index == 0 && (self.thinking || turn.role == Role::System) {
            p.push_control(Control::System);
        }
        if index == 0 && self.thinking {
            let effort = self
                .options
                .reasoning_effort
                .unwrap_or(ReasoningEffort::DEFAULT);
            p.push_text(&effort_line(effort.budget()));
        }
        match turn.role {
            Role::System => {
                if index > 0 {
                    p.push_control(Control::System);
                }
                if let Some(text) = &turn.text {
                    p.append(text.clone());
                }
                let msg = turn.source.expect("system turns come from messages");
                if !msg.tools.is_empty() {
                    p.push_text("\n\n");
                    p.append(
                        tools_block(&msg.tools)
                            .map_err(|e| e.within(&format!("{}.tools", turn.path)))?,
                    );
                }
                if let Some(rf) = msg.response_format.as_ref().filter(|v| json_py::truthy(v)) {
                    p.push_text(RESPONSE_FORMAT_HEADER);
                    p.push_text(&json_py::dumps(rf));
                }
            }
            Role::User => {
                p.push_control(Control::User);
                if turn.blocks.is_empty() {
                    if let Some(text) = &turn.text {
                        p.append(text.clone());
                    }
                } else {
                    let parts = turn.blocks.iter().map(user_block).collect();
                    p.append(Prompt::join(parts, "\n\n"));
                }
            }
            Role::LatestReminder => {
                p.push_control(Control::LatestReminder);
                match &turn.text {
                    Some(text) => p.append(text.clone()),
                    None => {
                        return Err(Error::input(
                            &format!("{}.content", turn.path),
                            "a latest_reminder needs content (the reference would render `None`)",
                        ))
                    }
                }
            }
            Role::Assistant => p.append(self.assistant(index, turn)?),
            Role::Tool => unreachable!("tool messages are merged into user turns"),
        }
        self.header(index, turn, &mut p);
        Ok(p)
    }

    fn assistant(&self, index: usize, turn: &Turn<'_>) -> Result<Prompt, Error> {
        let msg = turn.source.expect("assistant turns come from messages");
        let mut p = Prompt::new();
        let prev_has_task = index > 0 && self.turns[index - 1].task().is_some();
        if self.thinking && !prev_has_task && (!self.drop_thinking || index as i64 > self.last_user)
        {
            p.push_text(msg.reasoning_content.as_deref().unwrap_or(""));
            p.push_control(Control::ThinkEnd);
        }
        if let Some(text) = &turn.text {
            p.append(text.clone());
        }
        if !msg.tool_calls.is_empty() {
            let invokes = msg
                .tool_calls
                .iter()
                .enumerate()
                .map(|(i, call)| {
                    invoke(call).map_err(|e| e.within(&format!("{}.tool_calls[{i}]", turn.path)))
                })
                .collect::<Result<Vec<_>, _>>()?;
            p.push_text("\n\n<");
            p.push_control(Control::Dsml);
            p.push_text(" calls>\n");
            p.append(Prompt::join(invokes, "\n"));
            p.push_text("\n</");
            p.push_control(Control::Dsml);
            p.push_text(" calls>");
        }
        if !msg.wo_eos {
            p.push_control(Control::Eos);
        }
        Ok(p)
    }

    /// The generation header and task tokens after a turn (§2.4).
    fn header(&self, index: usize, turn: &Turn<'_>, p: &mut Prompt) {
        if let Some(next) = self.turns.get(index + 1) {
            if !matches!(next.role, Role::Assistant | Role::LatestReminder) {
                return;
            }
        }
        let think = |p: &mut Prompt, open: bool| {
            p.push_control(if open {
                Control::ThinkStart
            } else {
                Control::ThinkEnd
            })
        };
        match turn.task() {
            Some(Task::Action) => {
                p.push_control(Control::Assistant);
                think(p, self.thinking);
                p.push_control(Control::Action);
            }
            Some(task) => p.push_control(match task {
                Task::Query => Control::Query,
                Task::Authority => Control::Authority,
                Task::Domain => Control::Domain,
                Task::Title => Control::Title,
                Task::ReadUrl => Control::ReadUrl,
                Task::Action => unreachable!(),
            }),
            None if turn.role == Role::User || (turn.role == Role::System && index > 0) => {
                p.push_control(Control::Assistant);
                let open = self.thinking && (!self.drop_thinking || index as i64 >= self.last_user);
                think(p, open);
            }
            None => {}
        }
    }
}

fn user_block(block: &TurnBlock) -> Prompt {
    match block {
        TurnBlock::Text(p) => p.clone(),
        TurnBlock::ToolResult { content, .. } => {
            let mut p = Prompt::from("<tool_result>");
            p.append(content.clone());
            p.push_text("</tool_result>");
            p
        }
        TurnBlock::Unsupported(kind) => unsupported(kind.as_deref()),
    }
}

/// `_split_tool_name`: a `ns::name` name carries its namespace; an explicit namespace must
/// agree with it; neither part may contain another `::`.
pub(crate) fn split_tool_name(
    name: &str,
    namespace: Option<&str>,
) -> Result<(Option<String>, String), Error> {
    let assertion = |m: String| Error::reference(PyException::AssertionError, m);
    let (namespace, name) = match name.split_once("::") {
        Some((prefix, bare)) => {
            if let Some(ns) = namespace.filter(|ns| *ns != prefix) {
                return Err(assertion(format!(
                    "Conflicting tool namespaces: {ns} != {prefix}"
                )));
            }
            (Some(prefix), bare)
        }
        None => (namespace, name),
    };
    if name.contains("::") {
        return Err(assertion(format!(
            "Tool name must not contain '::': {name}"
        )));
    }
    if let Some(ns) = namespace.filter(|ns| ns.contains("::")) {
        return Err(assertion(format!(
            "Tool namespace must not contain '::': {ns}"
        )));
    }
    Ok((namespace.map(str::to_string), name.to_string()))
}

/// `_tool_name_for_encoding`: `ns::name` or `name`.
fn qualified_name(name: &str, namespace: Option<&Namespace>) -> Result<String, Error> {
    let (ns, bare) = split_tool_name(name, namespace.map(Namespace::name))?;
    Ok(match ns {
        Some(ns) => format!("{ns}::{bare}"),
        None => bare,
    })
}

/// The tools block (§2.3): preamble, one `json.dumps(function)` line per tool, epilogue.
fn tools_block(tools: &[Tool]) -> Result<Prompt, Error> {
    let mut lines = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let mut function: Map<String, Value> = tool.function.clone();
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let qualified = qualified_name(&name, tool.namespace.as_ref())
            .map_err(|e| e.within(&format!("[{i}]")))?;
        function.insert("name".into(), Value::String(qualified));
        if let Some(Namespace::Object {
            description: Some(ns_description),
            ..
        }) = &tool.namespace
        {
            let own = match function.get("description") {
                Some(v) if json_py::truthy(v) => match v.as_str() {
                    Some(s) => s.to_string(),
                    None => {
                        return Err(Error::input(
                            &format!("[{i}].function.description"),
                            "expected a string to append to the namespace description",
                        ))
                    }
                },
                _ => String::new(),
            };
            function.insert(
                "description".into(),
                Value::String(format!("{ns_description}\n{own}")),
            );
        }
        lines.push(json_py::dumps(&Value::Object(function)));
    }
    let mut p = Prompt::new();
    p.push_template(
        TOOLS_PREAMBLE,
        &[Control::Dsml, Control::ThinkStart, Control::ThinkEnd],
    );
    p.push_text(&lines.join("\n"));
    p.push_text(TOOLS_EPILOGUE);
    Ok(p)
}

/// One `<｜DSML｜ invoke>` element (§2.2).
fn invoke(call: &ToolCall) -> Result<Prompt, Error> {
    let name = qualified_name(&call.name, call.namespace.as_ref())?;
    let mut p = Prompt::from("<");
    p.push_control(Control::Dsml);
    p.push_text(" invoke name=\"");
    p.push_text(&name);
    p.push_text("\">\n");
    let params = arguments_object(&call.arguments)?
        .iter()
        .map(|(k, v)| {
            let mut q = Prompt::from("<");
            q.push_control(Control::Dsml);
            q.push_text(" parameter name=\"");
            q.push_text(k);
            match v {
                Value::String(s) => {
                    q.push_text("\" string=\"true\">");
                    q.push_text(s);
                }
                other => {
                    q.push_text("\" string=\"false\">");
                    q.push_text(&json_py::dumps(other));
                }
            }
            q.push_text("</");
            q.push_control(Control::Dsml);
            q.push_text(" parameter>");
            q
        })
        .collect();
    p.append(Prompt::join(params, "\n"));
    p.push_text("\n</");
    p.push_control(Control::Dsml);
    p.push_text(" invoke>");
    Ok(p)
}

/// The parameters of a call: an object as is; a JSON string (even double-encoded) decoded;
/// anything else becomes one parameter `arguments` holding the original value.
fn arguments_object(arguments: &Value) -> Result<Map<String, Value>, Error> {
    if let Value::Object(map) = arguments {
        return Ok(map.clone());
    }
    let mut decoded = arguments.clone();
    for _ in 0..2 {
        let Value::String(text) = &decoded else { break };
        match json_py::loads(text) {
            Ok(v) => decoded = v,
            Err(LoadsError::NotJson(_)) => break,
            Err(LoadsError::Unsupported(m)) => return Err(Error::input("function.arguments", m)),
        }
    }
    Ok(match decoded {
        Value::Object(map) => map,
        _ => {
            let mut map = Map::new();
            map.insert("arguments".into(), arguments.clone());
            map
        }
    })
}
