//! JUnit XML (the nextest/Jenkins flavour): one `<testcase>` per case; Fail -> `<failure>`,
//! harness Error -> `<error>`, NotSupported/Skipped -> `<skipped>`, Waived -> passed with the
//! waiver in `<system-out>`.

use super::RunReport;
use crate::outcome::Outcome;

pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => o += "&amp;",
            '<' => o += "&lt;",
            '>' => o += "&gt;",
            '"' => o += "&quot;",
            '\'' => o += "&apos;",
            c if (c as u32) < 0x20 && !matches!(c, '\n' | '\t' | '\r') => {
                o += &format!("&#x{:x};", c as u32)
            }
            c => o.push(c),
        }
    }
    o
}

pub fn render(r: &RunReport) -> String {
    let s = &r.summary;
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    x += &format!(
        "<testsuites name=\"ds41-conformance\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{:.3}\">\n",
        s.total,
        s.fail,
        s.error,
        s.skipped + s.not_supported,
        r.seconds
    );
    x += &format!(
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{:.3}\">\n",
        escape(&format!("ds41 certify: {} {} ({})", r.engine.name, r.engine.version, r.profile)),
        s.total,
        s.fail,
        s.error,
        s.skipped + s.not_supported,
        r.seconds
    );
    x += &format!("    <properties><property name=\"contract_version\" value=\"{}\"/><property name=\"case_list_hash\" value=\"{}\"/><property name=\"engine.driver\" value=\"{}\"/></properties>\n", escape(&r.contract_version), escape(&r.case_list_hash), escape(&r.engine.driver));
    for c in &r.results {
        x += &format!(
            "    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3}\"",
            escape(&c.family),
            escape(&c.name),
            c.seconds
        );
        let body = match &c.outcome {
            Outcome::Pass => None,
            Outcome::Fail { reason } => Some(format!(
                "<failure message=\"{}\">{}\nre-run: {}</failure>",
                escape(reason.lines().next().unwrap_or("")),
                escape(reason),
                escape(&c.rerun)
            )),
            Outcome::Error { reason } => Some(format!(
                "<error message=\"{}\">{}</error>",
                escape(reason.lines().next().unwrap_or("")),
                escape(reason)
            )),
            Outcome::NotSupported { capability } => Some(format!(
                "<skipped message=\"not supported: {}\"/>",
                escape(capability)
            )),
            Outcome::Skipped { reason } => {
                Some(format!("<skipped message=\"{}\"/>", escape(reason)))
            }
            Outcome::Waived { reason, failure } => Some(format!(
                "<system-out>WAIVED ({}): {}</system-out>",
                escape(reason),
                escape(failure)
            )),
        };
        match body {
            None => x += "/>\n",
            Some(b) => x += &format!(">\n      {b}\n    </testcase>\n"),
        }
    }
    x += "  </testsuite>\n</testsuites>\n";
    x
}
