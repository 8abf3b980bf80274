//! DSML family (CONTRACT.md §1.3): rendered prompts byte-exact against goldens (the five
//! official cases and the project's own), parse results exactly equal, refusals where the
//! format forbids something (developer role, V4 tag spellings).

use std::path::Path;

use crate::case::{Case, DsmlSpec, ParseSpec, RenderSpec};
use crate::engine_api::{Capability, Engine, EngineError, ParseRequest, RenderRequest};
use crate::outcome::Outcome;
use crate::runner::{engine_failure, require, timeout, Context, Details};

pub fn run(
    case: &Case,
    s: &DsmlSpec,
    engine: &mut dyn Engine,
    ctx: &Context,
    details: &mut Details,
) -> Result<Outcome, Outcome> {
    if let Some(r) = &s.render {
        return render_one(case, r, engine, ctx);
    }
    if let Some(p) = &s.parse {
        return parse_one(case, p, engine);
    }
    let dir = ctx.data(
        s.render_dir
            .as_ref()
            .expect("validated: one of render/parse/render_dir"),
    )?;
    render_dir(case, &dir, engine, details)
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

/// Every `NAME.json` with a sibling `NAME.txt` in `dir`: render the conversation (its own
/// thinking mode / effort fields apply) and compare byte for byte.
fn render_dir(
    case: &Case,
    dir: &Path,
    engine: &mut dyn Engine,
    details: &mut Details,
) -> Result<Outcome, Outcome> {
    if let Some(o) = require(engine, &[Capability::Render]) {
        return Ok(o);
    }
    let mut pairs: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| Outcome::error(format!("{}: {e}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json") && p.with_extension("txt").exists())
        .collect();
    pairs.sort();
    if pairs.is_empty() {
        return Err(Outcome::error(format!(
            "{}: no NAME.json + NAME.txt pairs",
            dir.display()
        )));
    }
    let mut bad = Vec::new();
    for p in &pairs {
        let req = RenderRequest {
            conversation: read_json(p)?,
            thinking_mode: None,
            reasoning_effort: None,
        };
        let want = read(&p.with_extension("txt"))?;
        match engine.render(&req, timeout(case)) {
            Ok(got) if got == want => {}
            Ok(got) => bad.push(format!(
                "{}: {}",
                p.display(),
                first_difference(&want, &got)
            )),
            Err(e) => bad.push(format!("{}: {e}", p.display())),
        }
    }
    details.notes.push(format!(
        "{}/{} prompts byte-exact",
        pairs.len() - bad.len(),
        pairs.len()
    ));
    Ok(if bad.is_empty() {
        Outcome::Pass
    } else {
        Outcome::fail(format!(
            "{}/{} prompts differ; first: {}",
            bad.len(),
            pairs.len(),
            bad[0]
        ))
    })
}
