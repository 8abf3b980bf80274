//! DSML reply parsing time against the size of one invoke (DSML.md §3, §4).
//!
//! `cargo bench -p ds41-engine --bench dsml_parse`
//!
//! Completions with one invoke of N parameters (N = 2,500 … 40,000; about 75 bytes each, so
//! up to 3 MB), parsed with the strict and the tolerant grammar; a second tolerant workload
//! spells the tags the V4 way and makes every value non-JSON, so each parameter adds a repair
//! to the recovery list. Both parsers are linear: the time per parameter stays flat as N
//! grows (a quadratic parser doubles it with N). The best of three runs is reported.

use std::time::{Duration, Instant};

use ds41_engine::dsml::{parse, ParseMode, ThinkingMode};

fn completion(params: usize, v4: bool) -> String {
    let (calls, invoke, param) = if v4 {
        ("tool_calls", "invoke", "parameter")
    } else {
        (" calls", " invoke", " parameter")
    };
    let value = if v4 { "not json" } else { "12345" };
    let mut s = format!("ok\n\n<｜DSML｜{calls}>\n<｜DSML｜{invoke} name=\"f\">\n");
    for i in 0..params {
        s.push_str(&format!(
            "<｜DSML｜{param} name=\"p{i}\" string=\"false\">{value}</｜DSML｜{param}>\n"
        ));
    }
    s.push_str(&format!(
        "</｜DSML｜{invoke}>\n</｜DSML｜{calls}><｜end▁of▁sentence｜>"
    ));
    s
}

fn best_of_three(f: impl Fn()) -> Duration {
    (0..3)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn main() {
    println!(
        "{:>8} {:>9} {:>14} {:>14} {:>14}",
        "params", "bytes", "strict µs/p", "tolerant µs/p", "tol-v4 µs/p"
    );
    for n in [2_500, 5_000, 10_000, 20_000, 40_000] {
        let text = completion(n, false);
        let v4 = completion(n, true);
        let strict = best_of_three(|| {
            let m = parse(&text, ParseMode::strict(ThinkingMode::Chat)).expect("strict parse");
            assert_eq!(m.tool_calls.len(), 1);
        });
        let tolerant = best_of_three(|| {
            let m = parse(&text, ParseMode::tolerant(ThinkingMode::Chat)).expect("tolerant");
            assert!(m.recoveries.is_empty());
        });
        let tolerant_v4 = best_of_three(|| {
            let m = parse(&v4, ParseMode::tolerant(ThinkingMode::Chat)).expect("tolerant");
            assert_eq!(m.recoveries.len(), n + 1);
        });
        let per = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
        println!(
            "{n:>8} {:>9} {:>14.3} {:>14.3} {:>14.3}",
            text.len(),
            per(strict),
            per(tolerant),
            per(tolerant_v4)
        );
    }
}
