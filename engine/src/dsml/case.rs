//! Loading conversations from JSON: OpenAI-style messages and the official test-case format of
//! `encoding/tests/test_input_N.json` (DSML.md §1: `load_cases` / `encode_case`).
//!
//! A case file is a list of messages, an object `{messages, tools?, thinking_mode?,
//! reasoning_effort?, context?}`, or a list of such objects. Case-level `tools` attach to
//! `messages[0]` (replacing its own), as the reference's `load_cases` does.
//!
//! Shape errors name the message and field (`messages[3].tool_calls[0].function.arguments:
//! missing`). Beyond plain shape errors, inputs for which the reference would render a Python
//! accident are refused here, explicitly: a `null` user/tool/reminder content (the reference
//! crashes or writes the text `None`), non-string content, reasoning or ids (it would write
//! their Python `repr`), unknown roles including `developer`, and `content_blocks` given
//! together with `content`. Unknown keys are ignored, as the reference ignores them (e.g. `mask`
//! in official case 4); a message's own `content_blocks` is read like list content.

use super::json_py;
use super::message::*;
use super::{Error, PyException};
use serde_json::{Map, Value};

/// One test case: the conversation plus the options the case itself sets.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    pub conversation: Conversation,
    /// `None` when unset (or `null` / empty): the caller's mode applies.
    pub thinking_mode: Option<ThinkingMode>,
    /// `None` when unset or `null`: the caller's effort (or the default) applies.
    pub reasoning_effort: Option<ReasoningEffort>,
    /// Project extension (not read by the official `load_cases`): `"drop_thinking": false`
    /// renders with `encode_messages(..., drop_thinking=False)`. Default true.
    pub drop_thinking: Option<bool>,
}

impl Case {
    /// `encode_case`'s options: the case's own mode and effort win over the caller's.
    pub fn options(&self, mode: ThinkingMode, effort: Option<ReasoningEffort>) -> RenderOptions {
        RenderOptions {
            thinking_mode: self.thinking_mode.unwrap_or(mode),
            reasoning_effort: self.reasoning_effort.or(effort),
            drop_thinking: self.drop_thinking.unwrap_or(true),
            ..RenderOptions::default()
        }
    }
}

/// Parses case-file text (see the module documentation) into its cases.
pub fn load_cases(text: &str) -> Result<Vec<Case>, Error> {
    let data = json_py::loads(text).map_err(|e| match e {
        json_py::LoadsError::NotJson(m) => Error::input("", format!("not valid JSON: {m}")),
        json_py::LoadsError::Unsupported(m) => Error::input("", m),
    })?;
    match &data {
        Value::Object(_) => Ok(vec![case_from_json(&data, "")?]),
        Value::Array(items) if items.is_empty() => Ok(vec![Case {
            conversation: Conversation::default(),
            thinking_mode: None,
            reasoning_effort: None,
            drop_thinking: None,
        }]),
        // A list of cases only when its first item looks like one; otherwise messages (so a
        // message without `role` is reported as such).
        Value::Array(items) if items[0].get("messages").is_none() => {
            let messages = messages_from_json(&data, "messages")?;
            Ok(vec![Case {
                conversation: Conversation {
                    messages,
                    context: Vec::new(),
                },
                thinking_mode: None,
                reasoning_effort: None,
                drop_thinking: None,
            }])
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, c)| case_from_json(c, &format!("[{i}]")))
            .collect(),
        _ => Err(Error::input(
            "",
            "expected a list of messages, a case object or a list of cases",
        )),
    }
}

/// Parses exactly one case (what `ds41 render` takes).
pub fn load_case(text: &str) -> Result<Case, Error> {
    let mut cases = load_cases(text)?;
    if cases.len() != 1 {
        return Err(Error::input(
            "",
            format!("the file holds {} cases; expected exactly one", cases.len()),
        ));
    }
    Ok(cases.remove(0))
}

fn case_from_json(value: &Value, path: &str) -> Result<Case, Error> {
    let obj = value
        .as_object()
        .ok_or_else(|| Error::input(path, "expected a case object"))?;
    let field = |name: &str| format!("{path}{}{name}", if path.is_empty() { "" } else { "." });
    let raw_messages = obj
        .get("messages")
        .ok_or_else(|| Error::input(&field("messages"), "missing"))?;
    let mut messages = messages_from_json(raw_messages, &field("messages"))?;
    if let Some(tools) = obj.get("tools") {
        let tools = tools_from_json(tools, &field("tools"))?;
        match messages.first_mut() {
            Some(first) => first.tools = tools,
            None => {
                return Err(Error::reference(
                    PyException::ValueError,
                    "A case with tools must contain at least one message",
                )
                .at(&field("tools")))
            }
        }
    }
    let context = match obj.get("context") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => messages_from_json(v, &field("context"))?,
    };
    let thinking_mode = match obj.get("thinking_mode") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) => Some(
            s.parse()
                .map_err(|e: Error| e.at(&field("thinking_mode")))?,
        ),
        Some(_) => {
            return Err(Error::input(
                &field("thinking_mode"),
                "expected \"chat\" or \"thinking\"",
            ))
        }
    };
    let reasoning_effort = match obj.get("reasoning_effort") {
        None => None,
        Some(v) => ReasoningEffort::from_json(v).map_err(|e| e.at(&field("reasoning_effort")))?,
    };
    let drop_thinking = match obj.get("drop_thinking") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(other) => {
            return Err(Error::input(
                &field("drop_thinking"),
                format!("expected a boolean, got {}", type_name(other)),
            ))
        }
    };
    Ok(Case {
        conversation: Conversation { messages, context },
        thinking_mode,
        reasoning_effort,
        drop_thinking,
    })
}

/// Parses a JSON list of messages; `path` names the list in errors.
pub fn messages_from_json(value: &Value, path: &str) -> Result<Vec<Message>, Error> {
    let items = value
        .as_array()
        .ok_or_else(|| Error::input(path, "expected a list of messages"))?;
    items
        .iter()
        .enumerate()
        .map(|(i, m)| message_from_json(m, &format!("{path}[{i}]")))
        .collect()
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// An optional string field: absent or `null` is `None`.
fn opt_string(obj: &Map<String, Value>, key: &str, path: &str) -> Result<Option<String>, Error> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(Error::input(
            &format!("{path}.{key}"),
            format!("expected a string, got {}", type_name(other)),
        )),
    }
}

/// Parses one message; `path` (e.g. `messages[3]`) prefixes every error.
pub fn message_from_json(value: &Value, path: &str) -> Result<Message, Error> {
    let obj = value.as_object().ok_or_else(|| {
        Error::input(
            path,
            format!("expected a message object, got {}", type_name(value)),
        )
    })?;
    let role_path = format!("{path}.role");
    let role = match obj.get("role") {
        None => return Err(Error::input(&role_path, "missing")),
        Some(Value::String(r)) => match r.as_str() {
            "system" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            "latest_reminder" => Role::LatestReminder,
            other => {
                let mut err = Error::reference(
                    PyException::NotImplementedError,
                    format!("Unknown role: {other}"),
                )
                .at(&role_path);
                if other == "developer" {
                    err = err.with_detail(
                        "encoding.py at dba1be0a has no developer role (vLLM/SGLang copies render it as a user turn); send it as `user` or `system`",
                    );
                }
                return Err(err);
            }
        },
        Some(other) => {
            return Err(Error::input(
                &role_path,
                format!("expected a string, got {}", type_name(other)),
            ))
        }
    };
    let content_path = format!("{path}.content");
    // A message's own `content_blocks` (DSML.md §1 step 1): the reference reads a non-empty
    // list exactly as it reads list `content`. With a `content` beside it the reference
    // renders a user turn from the blocks and other roles from the `content`, so that pair
    // is refused rather than guessed.
    let blocks_path = format!("{path}.content_blocks");
    let own_blocks = match obj.get("content_blocks") {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) if items.is_empty() => None,
        Some(Value::Array(items)) => Some(blocks_from_json(items, &blocks_path)?),
        Some(other) => {
            return Err(Error::input(
                &blocks_path,
                format!(
                    "expected a list of content blocks, got {}",
                    type_name(other)
                ),
            ))
        }
    };
    if let Some(blocks) = own_blocks {
        if obj.get("content").is_some_and(|c| !c.is_null()) {
            return Err(Error::input(
                &blocks_path,
                "given together with `content`: give the blocks as `content` or as `content_blocks`, not both",
            ));
        }
        return message_with_content(obj, path, role, Some(Content::Blocks(blocks)));
    }
    let content = match obj.get("content") {
        None => match role {
            Role::LatestReminder => {
                return Err(Error::input(
                    &content_path,
                    "missing (the reference would render the text `None`)",
                ))
            }
            _ => None,
        },
        Some(Value::Null) => match role {
            Role::System | Role::Assistant => None,
            _ => {
                return Err(Error::input(
                    &content_path,
                    format!(
                        "null content on a {} message (the reference crashes or renders the text `None`)",
                        role.as_str()
                    ),
                ))
            }
        },
        Some(Value::String(s)) => Some(Content::Text(s.clone())),
        Some(Value::Array(items)) => Some(Content::Blocks(blocks_from_json(items, &content_path)?)),
        Some(other) => {
            return Err(Error::input(
                &content_path,
                format!("expected a string or a list of content blocks, got {}", type_name(other)),
            ))
        }
    };
    message_with_content(obj, path, role, content)
}

/// The rest of a message, once its role and content are known.
fn message_with_content(
    obj: &Map<String, Value>,
    path: &str,
    role: Role,
    content: Option<Content>,
) -> Result<Message, Error> {
    let reasoning_content = opt_string(obj, "reasoning_content", path)?;
    let tools = match obj.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => tools_from_json(v, &format!("{path}.tools"))?,
    };
    let response_format = match obj.get("response_format") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.clone()),
    };
    let tool_calls = match obj.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, tc)| tool_call_from_json(tc, &format!("{path}.tool_calls[{i}]")))
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(Error::input(
                &format!("{path}.tool_calls"),
                format!("expected a list, got {}", type_name(other)),
            ))
        }
    };
    let tool_call_id = opt_string(obj, "tool_call_id", path)?;
    let task = match obj.get("task") {
        None | Some(Value::Null) => None,
        Some(Value::String(t)) => Some(Task::from_name(t).ok_or_else(|| {
            Error::reference(
                PyException::AssertionError,
                format!("Invalid task: '{t}'. Valid tasks are: {:?}", Task::NAMES),
            )
            .at(&format!("{path}.task"))
        })?),
        Some(other) => {
            return Err(Error::input(
                &format!("{path}.task"),
                format!(
                    "expected one of {:?}, got {}",
                    Task::NAMES,
                    type_name(other)
                ),
            ))
        }
    };
    let wo_eos = obj.get("wo_eos").is_some_and(json_py::truthy);
    Ok(Message {
        role,
        content,
        reasoning_content,
        tools,
        response_format,
        tool_calls,
        tool_call_id,
        task,
        wo_eos,
    })
}

fn blocks_from_json(items: &[Value], path: &str) -> Result<Vec<Block>, Error> {
    items
        .iter()
        .enumerate()
        .map(|(i, b)| block_from_json(b, &format!("{path}[{i}]")))
        .collect()
}

fn block_from_json(value: &Value, path: &str) -> Result<Block, Error> {
    let obj = value.as_object().ok_or_else(|| {
        Error::input(
            path,
            format!("expected a content block object, got {}", type_name(value)),
        )
    })?;
    let kind = match obj.get("type") {
        None | Some(Value::Null) => None,
        Some(Value::String(t)) => Some(t.as_str()),
        Some(other) => {
            return Err(Error::input(
                &format!("{path}.type"),
                format!("expected a string, got {}", type_name(other)),
            ))
        }
    };
    Ok(match kind {
        Some("text") => match obj.get("text") {
            None => Block::Text(String::new()),
            Some(Value::String(s)) => Block::Text(s.clone()),
            Some(other) => {
                return Err(Error::input(
                    &format!("{path}.text"),
                    format!("expected a string, got {}", type_name(other)),
                ))
            }
        },
        Some("image_url") => {
            let url = match obj.get("image_url") {
                None | Some(Value::Null) => Value::String(String::new()),
                Some(Value::String(s)) => Value::String(s.clone()),
                Some(Value::Object(o)) => o
                    .get("url")
                    .cloned()
                    .unwrap_or(Value::String(String::new())),
                Some(other) => {
                    return Err(Error::input(
                        &format!("{path}.image_url"),
                        format!(
                            "expected a string or an object with `url`, got {}",
                            type_name(other)
                        ),
                    ))
                }
            };
            let mut record = Map::new();
            record.insert("type".into(), "image".into());
            record.insert("url".into(), url);
            Block::Image(Value::Object(record))
        }
        Some("image") => {
            let mut record = Map::new();
            record.insert("type".into(), "image".into());
            for key in ["source", "url", "data"] {
                if let Some(v) = obj.get(key) {
                    record.insert(key.into(), v.clone());
                }
            }
            Block::Image(Value::Object(record))
        }
        Some("tool_result") => {
            let content_path = format!("{path}.content");
            let content = match obj.get("content") {
                None => ToolResultContent::Text(String::new()),
                Some(Value::String(s)) => ToolResultContent::Text(s.clone()),
                Some(Value::Array(items)) => ToolResultContent::Blocks(blocks_from_json(items, &content_path)?),
                Some(other) => {
                    return Err(Error::input(
                        &content_path,
                        format!(
                            "expected a string or a list of blocks, got {} (the reference would render its Python repr)",
                            type_name(other)
                        ),
                    ))
                }
            };
            Block::ToolResult {
                tool_use_id: opt_string(obj, "tool_use_id", path)?,
                content,
            }
        }
        other => Block::Unsupported(other.map(str::to_string)),
    })
}

fn namespace_from_json(value: &Value, path: &str) -> Result<Option<Namespace>, Error> {
    match value {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(Namespace::Name(s.clone()))),
        Value::Object(o) => {
            let name = match o.get("name") {
                Some(Value::String(s)) => s.clone(),
                None => return Err(Error::input(&format!("{path}.name"), "missing")),
                Some(other) => {
                    return Err(Error::input(
                        &format!("{path}.name"),
                        format!("expected a string, got {}", type_name(other)),
                    ))
                }
            };
            let description = match o.get("description") {
                Some(v) if !json_py::truthy(v) => None,
                None => None,
                Some(Value::String(s)) => Some(s.clone()),
                Some(other) => {
                    return Err(Error::input(
                        &format!("{path}.description"),
                        format!("expected a string, got {}", type_name(other)),
                    ))
                }
            };
            Ok(Some(Namespace::Object { name, description }))
        }
        other => Err(Error::input(
            path,
            format!("expected a string or an object, got {}", type_name(other)),
        )),
    }
}

/// Parses a `tools` list (OpenAI format).
pub fn tools_from_json(value: &Value, path: &str) -> Result<Vec<Tool>, Error> {
    let items = value.as_array().ok_or_else(|| {
        Error::input(
            path,
            format!("expected a list of tools, got {}", type_name(value)),
        )
    })?;
    let mut tools = Vec::with_capacity(items.len());
    for (i, tool) in items.iter().enumerate() {
        let tpath = format!("{path}[{i}]");
        let obj = tool.as_object().ok_or_else(|| {
            Error::input(
                &tpath,
                format!("expected a tool object, got {}", type_name(tool)),
            )
        })?;
        let mut function = match obj.get("function") {
            Some(Value::Object(f)) => f.clone(),
            None => return Err(Error::input(&format!("{tpath}.function"), "missing")),
            Some(other) => {
                return Err(Error::input(
                    &format!("{tpath}.function"),
                    format!("expected an object, got {}", type_name(other)),
                ))
            }
        };
        match function.get("name") {
            Some(Value::String(_)) => {}
            None => return Err(Error::input(&format!("{tpath}.function.name"), "missing")),
            Some(other) => {
                return Err(Error::input(
                    &format!("{tpath}.function.name"),
                    format!("expected a string, got {}", type_name(other)),
                ))
            }
        }
        // The tool's own namespace wins; the function's `namespace` key never reaches the
        // rendered schema.
        let function_ns = function.shift_remove("namespace");
        let namespace = match obj.get("namespace") {
            Some(v) if !v.is_null() => namespace_from_json(v, &format!("{tpath}.namespace"))?,
            _ => match function_ns {
                Some(v) => namespace_from_json(&v, &format!("{tpath}.function.namespace"))?,
                None => None,
            },
        };
        tools.push(Tool {
            function,
            namespace,
        });
    }
    Ok(tools)
}

fn tool_call_from_json(value: &Value, path: &str) -> Result<ToolCall, Error> {
    let obj = value.as_object().ok_or_else(|| {
        Error::input(
            path,
            format!("expected a tool call object, got {}", type_name(value)),
        )
    })?;
    let function = match obj.get("function") {
        Some(Value::Object(f)) => f,
        None => return Err(Error::input(&format!("{path}.function"), "missing")),
        Some(other) => {
            return Err(Error::input(
                &format!("{path}.function"),
                format!("expected an object, got {}", type_name(other)),
            ))
        }
    };
    let fpath = format!("{path}.function");
    let name = opt_string(function, "name", &fpath)?
        .ok_or_else(|| Error::input(&format!("{fpath}.name"), "missing"))?;
    let arguments = function
        .get("arguments")
        .cloned()
        .ok_or_else(|| Error::input(&format!("{fpath}.arguments"), "missing"))?;
    // `tool_call.get("id") or function.get("id")`, and likewise for the namespace.
    let id = match opt_string(obj, "id", path)? {
        Some(id) if !id.is_empty() => Some(id),
        _ => opt_string(function, "id", &fpath)?.filter(|id| !id.is_empty()),
    };
    let namespace = match obj.get("namespace") {
        Some(v) if json_py::truthy(v) => namespace_from_json(v, &format!("{path}.namespace"))?,
        _ => match function.get("namespace") {
            Some(v) => namespace_from_json(v, &format!("{fpath}.namespace"))?,
            None => None,
        },
    };
    Ok(ToolCall {
        id,
        namespace,
        name,
        arguments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_message_and_field() {
        let err =
            load_case(r#"[{"role": "user", "content": "a"}, {"role": "wizard"}]"#).unwrap_err();
        assert_eq!(err.to_string(), "messages[1].role: Unknown role: wizard");
        let err =
            load_case(r#"[{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}]"#)
                .unwrap_err();
        assert!(err
            .to_string()
            .starts_with("messages[0].tool_calls[0].function.arguments: missing"));
        let err = load_case(r#"[{"role": "user", "content": 3}]"#).unwrap_err();
        assert!(err
            .to_string()
            .starts_with("messages[0].content: expected a string or a list"));
        let err = load_case(r#"{"messages": [{"role": "user", "content": null}]}"#).unwrap_err();
        assert!(err
            .to_string()
            .starts_with("messages[0].content: null content"));
        let err = load_case(r#"[{"role": "developer", "content": "x"}]"#).unwrap_err();
        assert_eq!(
            err.reference_error().as_deref(),
            Some("NotImplementedError: Unknown role: developer")
        );
        let err = load_case("[{\"role\": ").unwrap_err();
        assert!(err.to_string().starts_with("not valid JSON"));
        let err = load_case(r#"{"messages": [], "tools": []}"#).unwrap_err();
        assert!(err
            .to_string()
            .contains("A case with tools must contain at least one message"));
    }
    #[test]
    fn own_content_blocks_read_like_list_content() {
        let blocks = r#"[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]"#;
        let own = load_case(&format!(
            r#"[{{"role": "user", "content_blocks": {blocks}}}]"#
        ))
        .unwrap();
        let list = load_case(&format!(r#"[{{"role": "user", "content": {blocks}}}]"#)).unwrap();
        assert_eq!(own, list);
        let empty =
            load_case(r#"[{"role": "user", "content": "x", "content_blocks": []}]"#).unwrap();
        assert_eq!(
            empty,
            load_case(r#"[{"role": "user", "content": "x"}]"#).unwrap()
        );
        let both = format!(r#"[{{"role": "user", "content": "x", "content_blocks": {blocks}}}]"#);
        let err = load_case(&both).unwrap_err().to_string();
        assert!(err.contains("messages[0].content_blocks"), "{err}");
    }

    #[test]
    fn case_level_tools_attach_to_message_zero() {
        let case = load_case(
            r#"{"thinking_mode": "thinking", "reasoning_effort": "max",
                "tools": [{"type": "function", "function": {"name": "f", "namespace": "x"}}],
                "messages": [{"role": "user", "content": "q", "tools": []}]}"#,
        )
        .unwrap();
        let m0 = &case.conversation.messages[0];
        assert_eq!(m0.tools.len(), 1);
        assert!(!m0.tools[0].function.contains_key("namespace"));
        assert_eq!(m0.tools[0].namespace, Some(Namespace::Name("x".into())));
        assert_eq!(case.thinking_mode, Some(ThinkingMode::Thinking));
        assert_eq!(case.reasoning_effort.map(|e| e.budget()), Some(100));
    }
}
