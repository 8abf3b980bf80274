//! Per-layer divergence plot (SVG, no dependencies): log10 of the worst residual rel L2 per
//! layer, one polyline per compared run, and the profile threshold as a dashed line — the
//! picture that says at a glance where an engine leaves the golden.

use crate::runner::CaseResult;

pub fn file_stem(case: &str) -> String {
    case.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf",
];

pub fn per_layer_plot(r: &CaseResult) -> Option<String> {
    let series = &r.details.per_layer;
    if series.is_empty() {
        return None;
    }
    let layers = series.iter().map(|s| s.1.len()).max().unwrap_or(0);
    if layers == 0 {
        return None;
    }
    let floor = 1e-12f64;
    let lg = |v: f64| v.max(floor).log10();
    let mut lo = f64::INFINITY;
    let mut hi = f64::NEG_INFINITY;
    for (_, vals) in series {
        for v in vals.iter().flatten() {
            if v.is_finite() {
                lo = lo.min(lg(*v));
                hi = hi.max(lg(*v));
            } else {
                hi = hi.max(3.0);
            }
        }
    }
    // A non-finite threshold (only a hand-made report has one) is not drawn: it would put
    // the axis at infinity.
    let threshold = r.details.residual_threshold.filter(|t| t.is_finite());
    if let Some(t) = threshold {
        lo = lo.min(lg(t));
        hi = hi.max(lg(t));
    }
    if !lo.is_finite() {
        return None;
    }
    let (lo, hi) = (lo.floor() - 0.5, hi.ceil() + 0.5);
    let (w, h, ml, mr, mt, mb) = (720.0, 360.0, 70.0, 170.0, 40.0, 50.0);
    let x = |l: usize| {
        ml + (w - ml - mr)
            * if layers > 1 {
                l as f64 / (layers - 1) as f64
            } else {
                0.5
            }
    };
    let y = |v: f64| mt + (h - mt - mb) * (hi - v) / (hi - lo);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{ml}\" y=\"20\" font-size=\"13\">{}</text>\n",
        super::junit::escape(&format!("{} — worst residual rel L2 per layer [{}]", r.name, r.outcome.label()))
    );
    // axes and decade grid
    let mut d = lo.ceil() as i64;
    while (d as f64) <= hi {
        let yy = y(d as f64);
        s += &format!("<line x1=\"{ml}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"#ddd\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">1e{d}</text>\n", w - mr, ml - 6.0, yy + 4.0);
        d += 1;
    }
    for l in 0..layers {
        s += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{l}</text>\n",
            x(l),
            h - mb + 16.0
        );
    }
    s += &format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">layer</text>\n",
        (ml + w - mr) / 2.0,
        h - 12.0
    );
    if let Some(t) = threshold {
        let yy = y(lg(t));
        s += &format!("<line x1=\"{ml}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"black\" stroke-dasharray=\"6,4\"/><text x=\"{:.1}\" y=\"{:.1}\">limit {t:.1e}</text>\n", w - mr, w - mr + 6.0, yy + 4.0);
    }
    for (i, (name, vals)) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let pts: Vec<String> = vals
            .iter()
            .enumerate()
            .filter_map(|(l, v)| {
                v.map(|v| {
                    format!(
                        "{:.1},{:.1}",
                        x(l),
                        y(if v.is_finite() { lg(v) } else { hi })
                    )
                })
            })
            .collect();
        s += &format!(
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>\n",
            pts.join(" ")
        );
        for p in &pts {
            let (px, py) = p.split_once(',').unwrap_or(("0", "0"));
            s += &format!("<circle cx=\"{px}\" cy=\"{py}\" r=\"3\" fill=\"{c}\"/>\n");
        }
        s += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{c}\">{}</text>\n",
            w - mr + 6.0,
            mt + 16.0 * (i as f64 + 2.0),
            super::junit::escape(name)
        );
    }
    if let Some(dv) = r.details.first_divergence.as_ref().map(|d| &d.at) {
        if let Some(l) = dv.layer {
            s += &format!("<line x1=\"{0:.1}\" y1=\"{mt}\" x2=\"{0:.1}\" y2=\"{1:.1}\" stroke=\"#d62728\" stroke-dasharray=\"2,3\"/><text x=\"{0:.1}\" y=\"{2:.1}\" fill=\"#d62728\" text-anchor=\"middle\">{3}</text>\n", x(l), h - mb, mt - 4.0, super::junit::escape(&format!("first divergence: token {} {}", dv.token, dv.subop)));
        }
    }
    s += "</svg>\n";
    Some(s)
}
