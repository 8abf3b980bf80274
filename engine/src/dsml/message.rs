//! Conversation types (DSML.md §1–§2): the messages `encode_messages` accepts, typed. Fields
//! keep the reference's names; loading from JSON (and every refusal) is in [`super::case`].

use super::{Error, PyException};
use serde_json::{Map, Value};
use std::fmt;
use std::str::FromStr;

/// `thinking_mode` of `encode_messages` / `parse_message_from_completion_text`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ThinkingMode {
    #[default]
    Chat,
    Thinking,
}

impl FromStr for ThinkingMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "chat" => Ok(ThinkingMode::Chat),
            "thinking" => Ok(ThinkingMode::Thinking),
            other => Err(Error::reference(
                PyException::AssertionError,
                format!("Invalid thinking_mode `{other}`"),
            )),
        }
    }
}

impl fmt::Display for ThinkingMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ThinkingMode::Chat => "chat",
            ThinkingMode::Thinking => "thinking",
        })
    }
}

/// A validated reasoning effort (DSML.md §2.1): a budget 1–100; `low`/`high`/`max` = 50/75/100.
/// Only rendered in thinking mode, on message 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReasoningEffort(u8);

impl ReasoningEffort {
    /// `None` means `"high"`.
    pub const DEFAULT: ReasoningEffort = ReasoningEffort(75);

    pub fn budget(self) -> u8 {
        self.0
    }

    fn invalid(shown: &str) -> Error {
        Error::reference(
            PyException::AssertionError,
            format!(
                "Invalid reasoning effort for deepseek_v41: {shown}, should be int within [1,100] or ['low', 'high', 'max']"
            ),
        )
    }

    pub fn from_budget(budget: i64) -> Result<Self, Error> {
        if (1..=100).contains(&budget) {
            Ok(ReasoningEffort(budget as u8))
        } else {
            Err(Self::invalid(&budget.to_string()))
        }
    }

    pub fn from_name(name: &str) -> Result<Self, Error> {
        match name {
            "low" => Ok(ReasoningEffort(50)),
            "high" => Ok(ReasoningEffort(75)),
            "max" => Ok(ReasoningEffort(100)),
            other => Err(Self::invalid(other)),
        }
    }

    /// From a JSON value as the reference checks it: `type(x) is int` (so no bools, no floats,
    /// not even `2.0`) within 1–100, or one of the three names. `null` means the default.
    pub fn from_json(value: &Value) -> Result<Option<Self>, Error> {
        match value {
            Value::Null => Ok(None),
            Value::String(s) => Self::from_name(s).map(Some),
            Value::Number(n) if n.is_i64() || n.is_u64() => match n.as_i64() {
                Some(i) => Self::from_budget(i).map(Some),
                None => Err(Self::invalid(&n.to_string())),
            },
            other => Err(Self::invalid(&super::json_py::py_str(other))),
        }
    }
}

impl FromStr for ReasoningEffort {
    type Err = Error;
    /// Command-line form: an integer, or `low` / `high` / `max`.
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.parse::<i64>() {
            Ok(i) => Self::from_budget(i),
            Err(_) => Self::from_name(s),
        }
    }
}

/// Message roles of this revision. `developer` and any other role are refused at load time
/// (`NotImplementedError: Unknown role: …`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    /// Merged into a user turn as a `<tool_result>` block before rendering (DSML.md §1 step 2).
    Tool,
    LatestReminder,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::LatestReminder => "latest_reminder",
        }
    }
}

/// The six task tokens (DSML.md §2.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Task {
    Action,
    Query,
    Authority,
    Domain,
    Title,
    ReadUrl,
}

impl Task {
    pub const NAMES: [&'static str; 6] = [
        "action",
        "query",
        "authority",
        "domain",
        "title",
        "read_url",
    ];

    pub fn from_name(name: &str) -> Option<Task> {
        Some(match name {
            "action" => Task::Action,
            "query" => Task::Query,
            "authority" => Task::Authority,
            "domain" => Task::Domain,
            "title" => Task::Title,
            "read_url" => Task::ReadUrl,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

/// A content block of list-valued `content` (DSML.md §1 step 1).
#[derive(Clone, Debug, PartialEq)]
pub enum Block {
    /// `{"type": "text", "text": …}`; a missing `text` is empty.
    Text(String),
    /// `{"type": "image" | "image_url", …}`: rendered as `<｜deepseek_image｜>`. The value is the
    /// image record (`{"type": "image", "url" | "source" | "data": …}`).
    Image(Value),
    /// `{"type": "tool_result", "tool_use_id": …, "content": …}` (Anthropic style).
    ToolResult {
        tool_use_id: Option<String>,
        content: ToolResultContent,
    },
    /// Any other block type: a user turn renders it as `[Unsupported {type}]`; joined text
    /// (system, assistant, tool content) skips it. `None` when the block has no `type`.
    Unsupported(Option<String>),
}

/// The content of a tool result.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolResultContent {
    Text(String),
    /// Text parts are joined with `"\n\n"`, other parts become `[Unsupported {type}]`.
    Blocks(Vec<Block>),
}

/// A message's `content`.
#[derive(Clone, Debug, PartialEq)]
pub enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

/// A tool namespace: a bare name, or an object with a name and an optional description that
/// the tools block prepends to each of its tools' descriptions (DSML.md §2.3).
#[derive(Clone, Debug, PartialEq)]
pub enum Namespace {
    Name(String),
    Object {
        name: String,
        description: Option<String>,
    },
}

impl Namespace {
    pub fn name(&self) -> &str {
        match self {
            Namespace::Name(n) => n,
            Namespace::Object { name, .. } => name,
        }
    }
}

/// A declared tool (`{"type": "function", "function": {...}, "namespace"?}`).
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    /// The `function` object, key order preserved, without its `namespace` key.
    pub function: Map<String, Value>,
    /// `tool.namespace`, else `function.namespace`.
    pub namespace: Option<Namespace>,
}

/// A tool call of an assistant message (OpenAI format).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// `id` (or `function.id`): orders the tool results that answer this call.
    pub id: Option<String>,
    /// The call's namespace, or `None` (a `ns::name` name carries it too).
    pub namespace: Option<Namespace>,
    pub name: String,
    /// An object, or a JSON string (possibly double-encoded), or anything else: a non-object
    /// renders as one `arguments` parameter (DSML.md §2.2).
    pub arguments: Value,
}

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub role: Role,
    /// `None` when the key is absent (or `null` where the reference treats it as empty).
    pub content: Option<Content>,
    pub reasoning_content: Option<String>,
    /// Tool schemas; rendered on system messages only, but on any message they force
    /// drop_thinking off. Empty means none (Python truthiness).
    pub tools: Vec<Tool>,
    /// Rendered on system messages when truthy.
    pub response_format: Option<Value>,
    pub tool_calls: Vec<ToolCall>,
    /// For `tool` messages: the call this answers.
    pub tool_call_id: Option<String>,
    pub task: Option<Task>,
    /// Assistant prefill: leave the turn open (no EOS).
    pub wo_eos: bool,
}

impl Message {
    /// A message of `role` with text content and nothing else.
    pub fn new(role: Role, content: &str) -> Self {
        Message {
            role,
            content: Some(Content::Text(content.to_string())),
            reasoning_content: None,
            tools: Vec::new(),
            response_format: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            task: None,
            wo_eos: false,
        }
    }
}

/// The messages to render and the already-rendered context before them (a continuation:
/// no BOS, no index-0 prefix).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Conversation {
    pub messages: Vec<Message>,
    pub context: Vec<Message>,
}

/// The keyword arguments of `encode_messages`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenderOptions {
    pub thinking_mode: ThinkingMode,
    /// `None` = `"high"`.
    pub reasoning_effort: Option<ReasoningEffort>,
    pub drop_thinking: bool,
    pub add_default_bos_token: bool,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            thinking_mode: ThinkingMode::Chat,
            reasoning_effort: None,
            drop_thinking: true,
            add_default_bos_token: true,
        }
    }
}
