//! Capabilities decide NotSupported before an engine is asked anything (PROTOCOL.md
//! "Capabilities"): a case's needs are derived from what it compares (its `require` tensors,
//! its model's layout, `verify`), so an engine that dumps only some tensors, reads only one
//! layout or has no payload check is NotSupported on the cases needing the rest, never Fail.
//! And an engine may answer `unsupported` with a reason (structured or legacy form).

use std::collections::BTreeSet;
use std::time::Duration;

use ds41_conformance::case::Case;
use ds41_conformance::engine_api::*;
use ds41_conformance::outcome::Outcome;
use ds41_conformance::protocol::AdapterEngine;
use ds41_conformance::runner::{self, run_case, Context};

/// Declares `caps` and answers every request with a failure: a case that reaches it Fails,
/// so a NotSupported verdict proves the capability check stopped the case first.
struct Declares(BTreeSet<Capability>);

impl Declares {
    fn new(names: &[&str]) -> Declares {
        let (caps, unknown) = declared_capabilities(names.iter().copied());
        assert!(unknown.is_empty(), "{unknown:?}");
        Declares(caps)
    }
}

fn reached<T>() -> EngineResult<T> {
    Err(EngineError::Failed(
        "reached the engine: the capability check let the case through".into(),
    ))
}

impl Engine for Declares {
    fn identity(&self) -> EngineIdentity {
        EngineIdentity {
            name: "declares".into(),
            version: "0".into(),
            commit: None,
            driver: "test".into(),
        }
    }
    fn capabilities(&self) -> BTreeSet<Capability> {
        self.0.clone()
    }
    fn load(&mut self, _: &LoadRequest, _: Duration) -> EngineResult<()> {
        reached()
    }
    fn tokenize(&mut self, _: &TokenizeRequest, _: Duration) -> EngineResult<Vec<Vec<u32>>> {
        reached()
    }
    fn render(&mut self, _: &RenderRequest, _: Duration) -> EngineResult<String> {
        reached()
    }
    fn parse(&mut self, _: &ParseRequest, _: Duration) -> EngineResult<serde_json::Value> {
        reached()
    }
    fn forward(&mut self, _: &ForwardRequest, _: Duration) -> EngineResult<()> {
        reached()
    }
}

fn context(work: &std::path::Path) -> Context {
    Context::in_tree(work, "").expect("context")
}

fn case(name: &str) -> Case {
    runner::load_suite(&runner::default_cases_dir())
        .expect("suite")
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no case {name}"))
}

fn not_supported(outcome: &Outcome) -> String {
    match outcome {
        Outcome::NotSupported { capability } => capability.clone(),
        other => panic!("expected NotSupported, got {other:?}"),
    }
}

const RESIDUAL_ONLY: &[&str] = &[
    "load",
    "forward",
    "trace.logits",
    "trace.residual",
    "prefill",
    "numerics.exact",
    "numerics.upstream",
    "index_k.as_shipped",
    "index_k.owner",
];

#[test]
fn a_residual_only_engine_is_not_supported_where_a_case_needs_decisions() {
    let work = tempfile::tempdir().unwrap();
    let ctx = context(work.path());
    // Requires logits, residual, experts, topk and engram_hash.
    let c = case("residual::goldens::tiny-container-p01-d23-exact-as-shipped");
    let r = run_case(&c, &mut Declares::new(RESIDUAL_ONLY), &ctx);
    assert_eq!(not_supported(&r.outcome), "trace.experts");
    let mut with_experts = RESIDUAL_ONLY.to_vec();
    with_experts.push("trace.experts");
    let r = run_case(&c, &mut Declares::new(&with_experts), &ctx);
    assert_eq!(not_supported(&r.outcome), "trace.topk");
    // The legacy `trace` stands for every per-tensor capability: the case reaches the engine.
    let mut legacy = RESIDUAL_ONLY.to_vec();
    legacy.push("trace");
    let r = run_case(&c, &mut Declares::new(&legacy), &ctx);
    assert!(
        matches!(&r.outcome, Outcome::Fail { reason } if reason.contains("reached the engine")),
        "{:?}",
        r.outcome
    );
}

#[test]
fn sub_op_cases_need_trace_sub_ops_and_replay_needs_replay() {
    let c = |require: &str, replay: bool| {
        let text = format!(
            "family: residual\ncases:\n  - name: a\n    model: synthetic:tiny/release@1\n    golden: {{file: repo:goldens/traces/x.safetensors}}\n    numerics: exact\n    index_k: owner\n    replay: {replay}\n    require: [{require}]\n"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("x.yaml");
        std::fs::write(&file, text).unwrap();
        let cases =
            ds41_conformance::case::load_case_file(&file).unwrap_or_else(|e| panic!("{e:#}"));
        match &cases[0].spec {
            ds41_conformance::case::Spec::Residual(s) => {
                ds41_conformance::families::residual::trace_capabilities(s)
            }
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(
        c("logits, attn_out, moe_out", false),
        vec![Capability::TraceLogits, Capability::TraceSubOps]
    );
    assert_eq!(
        c(
            "logits, residual, experts, topk, engram_hash, expert_weights",
            true
        ),
        vec![
            Capability::TraceLogits,
            Capability::TraceResidual,
            Capability::TraceExperts,
            Capability::TraceTopk,
            Capability::TraceEngramHash,
        ]
    );
}

#[test]
fn layouts_and_the_payload_check_are_capabilities() {
    let work = tempfile::tempdir().unwrap();
    let ctx = context(work.path());
    let container = case("loader::synthetic::tiny-container-loads");
    let r = run_case(
        &container,
        &mut Declares::new(&["load", "layout.release"]),
        &ctx,
    );
    assert_eq!(not_supported(&r.outcome), "layout.container");
    // No layout named at all: the original promise (both layouts) holds and the case runs.
    let r = run_case(&container, &mut Declares::new(&["load"]), &ctx);
    assert!(r.outcome.is_fail(), "{:?}", r.outcome);

    let verify = runner::load_suite(&runner::default_cases_dir())
        .expect("suite")
        .into_iter()
        .find(|c| matches!(&c.spec, ds41_conformance::case::Spec::Loader(s) if s.verify))
        .expect("a loader case with verify: true");
    let r = run_case(
        &verify,
        &mut Declares::new(&["load", "layout.release", "layout.container"]),
        &ctx,
    );
    assert_eq!(not_supported(&r.outcome), "load.verify");
}

/// An engine answering `unsupported` for `load`, in the structured form and in the legacy
/// forms (`CAPABILITY` alone, `CAPABILITY: reason`); an unknown name is a Fail.
const UNSUPPORTED: &str = r#"form=$1
while IFS= read -r line; do
  id=$(printf '%s' "$line" | sed -n 's/^{"id":\([0-9]*\).*/\1/p')
  case "$line" in
    *'"op":"hello"'*)
      printf '{"id":%s,"ok":true,"result":{"protocol":"ds41-engine/1","engine":{"name":"unsupported-%s","version":"0"},"capabilities":["load"]}}\n' "$id" "$form";;
    *'"op":"shutdown"'*) printf '{"id":%s,"ok":true,"result":{}}\n' "$id"; exit 0;;
    *) case "$form" in
         structured) printf '{"id":%s,"ok":false,"error":{"kind":"unsupported","capability":"load","message":"this build reads no checkpoints"}}\n' "$id";;
         bare) printf '{"id":%s,"ok":false,"error":{"kind":"unsupported","message":"load"}}\n' "$id";;
         colon) printf '{"id":%s,"ok":false,"error":{"kind":"unsupported","message":"load: this build reads no checkpoints"}}\n' "$id";;
         unknown) printf '{"id":%s,"ok":false,"error":{"kind":"unsupported","message":"teleport: not today"}}\n' "$id";;
       esac;;
  esac
done
"#;

#[test]
fn unsupported_answers_may_carry_a_reason() {
    let work = tempfile::tempdir().unwrap();
    let ctx = context(work.path());
    let script = work.path().join("unsupported.sh");
    std::fs::write(&script, UNSUPPORTED).unwrap();
    let c = case("loader::synthetic::tiny-release-loads");
    let run = |form: &str| {
        let mut e =
            AdapterEngine::start(&format!("exec sh {} {form}", script.display())).expect("hello");
        run_case(&c, &mut e, &ctx).outcome
    };
    assert_eq!(
        not_supported(&run("structured")),
        "load: this build reads no checkpoints"
    );
    assert_eq!(not_supported(&run("bare")), "load");
    assert_eq!(
        not_supported(&run("colon")),
        "load: this build reads no checkpoints"
    );
    assert!(
        matches!(&run("unknown"), Outcome::Fail { reason } if reason.contains("teleport")),
        "an unsupported answer naming no known capability is a Fail"
    );
}

#[test]
fn declared_capabilities_expand_the_shorthands() {
    let (caps, unknown) = declared_capabilities(["forward", "trace", "warp.drive"]);
    assert_eq!(unknown, vec!["warp.drive".to_string()]);
    for c in Capability::TRACE_PARTS {
        assert!(caps.contains(&c), "`trace` implies {c}");
    }
    // `forward` alone keeps its original promise (logits) and nothing more.
    let (caps, _) = declared_capabilities(["forward"]);
    assert!(caps.contains(&Capability::TraceLogits));
    assert!(!caps.contains(&Capability::TraceResidual));
    // Any explicit trace.* is taken literally: an engine may lack logits.
    let (caps, _) = declared_capabilities(["forward", "trace.residual", "layout.container"]);
    assert!(!caps.contains(&Capability::TraceLogits));
    assert!(!caps.contains(&Capability::LayoutRelease));
    // `vision` stands for its three parts.
    let (caps, _) = declared_capabilities(["vision"]);
    for c in Capability::VISION_PARTS {
        assert!(caps.contains(&c), "`vision` implies {c}");
    }
    let (caps, _) = declared_capabilities(["vision.span"]);
    assert!(!caps.contains(&Capability::VisionTower));
    // Every name round-trips.
    for c in Capability::ALL {
        assert_eq!(Capability::parse(c.as_str()), Some(c));
    }
}

/// Rows `| `name` | ... | `capability` | ...` of the Markdown tables in `doc` whose header has
/// a `capability` column: (tensor family, capability name). `topk.L{l}` → `topk`.
fn doc_tensor_table(doc: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(runner::repo_root().join(doc)).expect("doc");
    let mut out = Vec::new();
    let mut column = None;
    for line in text.lines() {
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        if !line.trim_start().starts_with('|') {
            column = None;
            continue;
        }
        if let Some(i) = cells.iter().position(|c| *c == "capability") {
            if cells
                .first()
                .is_some_and(|c| *c == "name" || *c == "tensor")
            {
                column = Some(i);
                continue;
            }
        }
        let (Some(i), Some(name)) = (column, cells.first()) else {
            continue;
        };
        let Some(name) = name.strip_prefix('`').and_then(|n| n.strip_suffix('`')) else {
            continue;
        };
        let family = name.split_once(".L").map_or(name, |(f, _)| f).to_string();
        out.push((family, cells[i].trim_matches('`').to_string()));
    }
    out
}

#[test]
fn the_trace_tables_of_the_docs_agree_with_the_code() {
    let code: Vec<(String, String)> = TRACE_TENSORS
        .iter()
        .map(|(n, c)| (n.to_string(), c.as_str().to_string()))
        .collect();
    for doc in ["docs/TRACE.md", "conformance/PROTOCOL.md"] {
        let mut table = doc_tensor_table(doc);
        // Tensors written but never compared (`input_ids`, `final_pre`) carry no capability.
        table.retain(|(_, c)| c != "—");
        let mut want = code.clone();
        want.sort();
        table.sort();
        assert_eq!(
            table, want,
            "{doc}: the tensor/capability tables differ from TRACE_TENSORS"
        );
    }
    // And every capability of the PROTOCOL.md capability table is one the harness knows.
    let text = std::fs::read_to_string(runner::repo_root().join("conformance/PROTOCOL.md"))
        .expect("PROTOCOL.md");
    let start = text
        .find("| capability | promise |")
        .expect("capability table");
    let mut documented = BTreeSet::new();
    for line in text[start..].lines().skip(2) {
        if !line.starts_with('|') {
            break;
        }
        let first = line.trim_matches('|').split('|').next().unwrap_or("");
        for name in first.split(',') {
            let name = name.trim().trim_matches('`');
            let c = Capability::parse(name)
                .unwrap_or_else(|| panic!("PROTOCOL.md documents unknown capability `{name}`"));
            documented.insert(c);
        }
    }
    let all: BTreeSet<Capability> = Capability::ALL.into_iter().collect();
    assert_eq!(
        documented, all,
        "PROTOCOL.md's capability table and Capability::ALL differ"
    );
}
