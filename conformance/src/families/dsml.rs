//! DSML family (CONTRACT.md §1.3): rendered prompts byte-exact against goldens (the five
//! official cases and the project's own), parse results exactly equal, refusals where the
//! format forbids something (developer role, V4 tag spellings).

use std::path::Path;

use crate::case::{Case, DataRef, ModelRef};
use crate::engine_api::{Capability, Engine, EngineError, ParseRequest, RenderRequest};
use crate::outcome::Outcome;
use crate::runner::{engine_failure, require, timeout, Context, Details};

use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------------------- case spec

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenderSpec {
    /// Official test-case format JSON.
    pub conversation: DataRef,
    /// Expected prompt text (byte-exact), or...
    #[serde(default)]
    pub expected: Option<DataRef>,
    /// ...an expected refusal containing this text.
    #[serde(default)]
    pub expect_error: Option<String>,
    #[serde(default)]
    pub thinking_mode: Option<String>,
    #[serde(default)]
    pub reasoning_effort: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParseSpec {
    pub completion: String,
    #[serde(default)]
    pub thinking: bool,
    #[serde(default)]
    pub tolerant: bool,
    /// Expected message (official parser shape), or...
    #[serde(default)]
    pub expected: Option<serde_json::Value>,
    /// ...expected refusal containing this text.
    #[serde(default)]
    pub expect_error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DsmlSpec {
    #[serde(default)]
    pub render: Option<RenderSpec>,
    #[serde(default)]
    pub parse: Option<ParseSpec>,
    /// Every `NAME.json` with `NAME.txt` (expected prompt) or `NAME.error` (expected
    /// refusal, `"<ExceptionType>: <message>"`) in this directory.
    #[serde(default)]
    pub render_dir: Option<DataRef>,
    /// Probes of the official encoder/parser: `{inputs: DATA, results: DATA}` (the
    /// `reference_probe_*.json` format); render and parse probes run, others are counted.
    #[serde(default)]
    pub probes: Option<ProbeFiles>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeFiles {
    pub inputs: DataRef,
    pub results: DataRef,
}

impl super::CheckFamily for DsmlSpec {
    fn models(&self) -> Vec<ModelRef> {
        Vec::new()
    }

    fn data(&self) -> Vec<&DataRef> {
        let mut out: Vec<&DataRef> = Vec::new();
        if let Some(r) = &self.render {
            out.push(&r.conversation);
            out.extend(&r.expected);
        }
        out.extend(&self.render_dir);
        if let Some(p) = &self.probes {
            out.extend([&p.inputs, &p.results]);
        }
        out
    }

    fn validate(&self) -> Result<(), String> {
        let s = self;
        let n = usize::from(s.render.is_some())
            + usize::from(s.parse.is_some())
            + usize::from(s.render_dir.is_some())
            + usize::from(s.probes.is_some());
        if n != 1 {
            return Err("give exactly one of `render`, `parse`, `render_dir` and `probes`".into());
        }
        if let Some(r) = &s.render {
            if r.expected.is_some() == r.expect_error.is_some() {
                return Err(
                    "field `render`: give exactly one of `expected` and `expect_error`".into(),
                );
            }
        }
        if let Some(p) = &s.parse {
            if p.expected.is_some() == p.expect_error.is_some() {
                return Err(
                    "field `parse`: give exactly one of `expected` and `expect_error`".into(),
                );
            }
        }
        Ok(())
    }

    fn run(
        &self,
        case: &Case,
        engine: &mut dyn Engine,
        ctx: &Context,
        details: &mut Details,
    ) -> Result<Outcome, Outcome> {
        let s = self;
        if let Some(r) = &s.render {
            return render_one(case, r, engine, ctx);
        }
        if let Some(p) = &s.parse {
            return parse_one(case, p, engine);
        }
        if let Some(p) = &s.probes {
            return probes(
                case,
                &ctx.data(&p.inputs)?,
                &ctx.data(&p.results)?,
                engine,
                details,
            );
        }
        let dir = ctx.data(
            s.render_dir
                .as_ref()
                .expect("validated: one of render/parse/render_dir/probes"),
        )?;
        render_dir(case, &dir, engine, details)
    }
}

fn read(path: &Path) -> Result<String, Outcome> {
    std::fs::read_to_string(path).map_err(|e| Outcome::error(format!("{}: {e}", path.display())))
}

fn read_json(path: &Path) -> Result<serde_json::Value, Outcome> {
    serde_json::from_str(&read(path)?)
        .map_err(|e| Outcome::error(format!("{}: {e}", path.display())))
}

/// Where two strings first differ, with a little context, for a failure reason.
pub fn first_difference(want: &str, got: &str) -> String {
    let off = want
        .bytes()
        .zip(got.bytes())
        .position(|(a, b)| a != b)
        .unwrap_or(want.len().min(got.len()));
    let ctx = |s: &str| {
        let lo = s.floor_char_boundary(off.saturating_sub(30));
        let hi = s.ceil_char_boundary((off + 30).min(s.len()));
        format!("{:?}", &s[lo..hi])
    };
    format!(
        "first difference at byte {off} (expected {} bytes, got {}): expected …{}…, got …{}…",
        want.len(),
        got.len(),
        ctx(want),
        ctx(got)
    )
}

fn render_one(
    case: &Case,
    r: &RenderSpec,
    engine: &mut dyn Engine,
    ctx: &Context,
) -> Result<Outcome, Outcome> {
    if let Some(o) = require(engine, &[Capability::Render]) {
        return Ok(o);
    }
    let conversation = read_json(&ctx.data(&r.conversation)?)?;
    let req = RenderRequest {
        conversation,
        thinking_mode: r.thinking_mode.clone(),
        reasoning_effort: r.reasoning_effort.clone(),
    };
    let res = engine.render(&req, timeout(case));
    Ok(match (&r.expected, &r.expect_error, res) {
        (Some(exp), _, Ok(got)) => {
            let want = read(&ctx.data(exp)?)?;
            if want == got {
                Outcome::Pass
            } else {
                Outcome::fail(format!(
                    "prompt differs from {exp}: {}",
                    first_difference(&want, &got)
                ))
            }
        }
        (Some(_), _, Err(e)) => engine_failure("render", e),
        (None, Some(want), Err(EngineError::Refused(m))) => refusal_check(engine, want, &m),
        (None, Some(want), Ok(got)) => Outcome::fail(format!(
            "rendered a conversation that must be refused (`{want}`): {:?}",
            truncate(&got)
        )),
        (None, _, Err(e)) => engine_failure("render", e),
        (None, None, Ok(_)) => {
            Outcome::error("validated case has neither expected nor expect_error")
        }
    })
}

fn parse_one(case: &Case, p: &ParseSpec, engine: &mut dyn Engine) -> Result<Outcome, Outcome> {
    if let Some(o) = require(engine, &[Capability::Parse]) {
        return Ok(o);
    }
    let req = ParseRequest {
        completion: p.completion.clone(),
        thinking: p.thinking,
        tolerant: p.tolerant,
    };
    Ok(
        match (
            &p.expected,
            &p.expect_error,
            engine.parse(&req, timeout(case)),
        ) {
            (Some(want), _, Ok(got)) if *want == got => Outcome::Pass,
            (Some(want), _, Ok(got)) => Outcome::fail(format!(
                "parsed message differs: expected {want}, got {got}"
            )),
            (Some(_), _, Err(e)) => engine_failure("parse", e),
            (None, Some(want), Err(EngineError::Refused(m))) => refusal_check(engine, want, &m),
            (None, Some(want), Ok(got)) => Outcome::fail(format!(
                "accepted a completion the grammar rejects (`{want}`): {got}"
            )),
            (None, _, Err(e)) => engine_failure("parse", e),
            (None, None, Ok(_)) => {
                Outcome::error("validated case has neither expected nor expect_error")
            }
        },
    )
}

fn refusal_check(engine: &dyn Engine, want: &str, got: &str) -> Outcome {
    if super::is_reference(engine) && !got.contains(want) {
        Outcome::fail(format!(
            "refused, but expected the error to name `{want}`; got: {got}"
        ))
    } else {
        Outcome::Pass
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(120).collect()
}

/// Every `NAME.json` with a sibling `NAME.txt` (expected prompt) or `NAME.error` (expected
/// refusal) in `dir`: render the conversation (its own thinking mode / effort fields apply)
/// and compare byte for byte, or require the refusal.
fn render_dir(
    case: &Case,
    dir: &Path,
    engine: &mut dyn Engine,
    details: &mut Details,
) -> Result<Outcome, Outcome> {
    if let Some(o) = require(engine, &[Capability::Render]) {
        return Ok(o);
    }
    let mut inputs: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| Outcome::error(format!("{}: {e}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "json")
                && (p.with_extension("txt").exists() || p.with_extension("error").exists())
        })
        .collect();
    inputs.sort();
    if inputs.is_empty() {
        return Err(Outcome::error(format!(
            "{}: no NAME.json + NAME.txt/NAME.error pairs",
            dir.display()
        )));
    }
    // The directory was resolved inside its root; its files must not link out of it.
    for p in &inputs {
        for f in [
            p.clone(),
            p.with_extension("txt"),
            p.with_extension("error"),
        ] {
            if let Some(name) = f
                .file_name()
                .and_then(|n| n.to_str())
                .filter(|_| f.exists())
            {
                crate::case::resolve_inside(dir, name).map_err(Outcome::error)?;
            }
        }
    }
    let mut bad = Vec::new();
    for p in &inputs {
        let req = RenderRequest {
            conversation: read_json(p)?,
            thinking_mode: None,
            reasoning_effort: None,
        };
        let name = p
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("?")
            .to_string();
        let got = engine.render(&req, timeout(case));
        if p.with_extension("txt").exists() {
            let want = read(&p.with_extension("txt"))?;
            match got {
                Ok(got) if got == want => {}
                Ok(got) => bad.push(format!("{name}: {}", first_difference(&want, &got))),
                Err(e) => bad.push(format!("{name}: {e}")),
            }
        } else {
            let want = read(&p.with_extension("error"))?.trim().to_string();
            match got {
                Err(EngineError::Refused(m)) => {
                    if let Outcome::Fail { reason } = refusal_check(engine, &want, &m) {
                        bad.push(format!("{name}: {reason}"));
                    }
                }
                Ok(_) => bad.push(format!(
                    "{name}: rendered a conversation that must be refused ({want})"
                )),
                Err(e) => bad.push(format!("{name}: {e}")),
            }
        }
    }
    details.notes.push(format!(
        "{}/{} goldens agree",
        inputs.len() - bad.len(),
        inputs.len()
    ));
    Ok(if bad.is_empty() {
        Outcome::Pass
    } else {
        Outcome::fail(format!(
            "{}/{} goldens differ; first: {}",
            bad.len(),
            inputs.len(),
            bad[0]
        ))
    })
}

/// The official encoder/parser probes: `encode_messages` probes render, the
/// `parse_message_from_completion_text` probes parse (strict), each against the recorded
/// official result (a value, or an exception the engine must answer with a refusal).
/// Probes of entry points outside the engine surface (`render_message`, non-default
/// `drop_thinking`) are counted as not applicable.
fn probes(
    case: &Case,
    inputs: &Path,
    results: &Path,
    engine: &mut dyn Engine,
    details: &mut Details,
) -> Result<Outcome, Outcome> {
    let caps = engine.capabilities();
    if !caps.contains(&Capability::Render) && !caps.contains(&Capability::Parse) {
        return Ok(Outcome::not_supported(Capability::Render.as_str()));
    }
    let inputs = read_json(inputs)?;
    let results = read_json(results)?;
    let probes = inputs["probes"]
        .as_object()
        .ok_or_else(|| Outcome::error("probe inputs: no `probes` object"))?;
    let (mut ran, mut skipped, mut bad) = (0usize, 0usize, Vec::new());
    for (name, p) in probes {
        let r = &results[name];
        if r.is_null() {
            return Err(Outcome::error(format!(
                "probe `{name}` has no recorded result"
            )));
        }
        let call = p["call"].as_str().unwrap_or("");
        let thinking = p["thinking_mode"].as_str() == Some("thinking");
        let got =
            if call == "parse_message_from_completion_text" && caps.contains(&Capability::Parse) {
                let text = p["text"].as_str().unwrap_or("").to_string();
                engine.parse(
                    &ParseRequest {
                        completion: text,
                        thinking,
                        tolerant: false,
                    },
                    timeout(case),
                )
            } else if call.starts_with("encode_messages")
                && caps.contains(&Capability::Render)
                && p.get("drop_thinking").is_none_or(|d| d == true)
                && p.get("context").is_none()
            {
                let mut conv = serde_json::json!({ "messages": p["messages"] });
                for k in ["thinking_mode", "reasoning_effort"] {
                    if let Some(v) = p.get(k) {
                        conv[k] = v.clone();
                    }
                }
                let truncated = call.contains("truncated");
                engine
                    .render(
                        &RenderRequest {
                            conversation: conv,
                            thinking_mode: None,
                            reasoning_effort: None,
                        },
                        timeout(case),
                    )
                    .map(|s| {
                        serde_json::Value::String(if truncated {
                            s.chars().take(80).collect()
                        } else {
                            s
                        })
                    })
            } else {
                skipped += 1;
                continue;
            };
        ran += 1;
        let verdict = match (r["ok"].as_bool(), got) {
            (Some(true), Ok(v)) if v == r["value"] => None,
            (Some(true), Ok(v)) => Some(match (&r["value"], &v) {
                (serde_json::Value::String(w), serde_json::Value::String(g)) => {
                    first_difference(w, g)
                }
                (w, g) => format!("expected {w}, got {g}"),
            }),
            (Some(true), Err(e)) => Some(e.to_string()),
            (_, Err(EngineError::Refused(m))) => {
                match refusal_check(engine, r["error"].as_str().unwrap_or(""), &m) {
                    Outcome::Pass => None,
                    o => o.reason(),
                }
            }
            (_, Ok(v)) => Some(format!(
                "accepted; the official code raises {}: got {v}",
                r["error"]
            )),
            (_, Err(e)) => Some(e.to_string()),
        };
        if let Some(v) = verdict {
            bad.push(format!("{name}: {v}"));
        }
    }
    details.notes.push(format!(
        "{} probes run, {} agree, {} outside the engine surface",
        ran,
        ran - bad.len(),
        skipped
    ));
    Ok(if ran == 0 {
        Outcome::not_supported(Capability::Parse.as_str())
    } else if bad.is_empty() {
        Outcome::Pass
    } else {
        Outcome::fail(format!(
            "{}/{ran} probes disagree with the official code; first: {}",
            bad.len(),
            bad[0]
        ))
    })
}
