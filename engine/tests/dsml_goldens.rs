//! The project's own DSML goldens (`goldens/dsml/`, provenance in its README): every case
//! renders to its hand-derived `.txt` byte for byte, or fails with its `.error`
//! (`"<Exception>: message"`, as the reference raises it).

use ds41_engine::dsml::{self, ThinkingMode};
use std::path::PathBuf;

#[test]
fn project_goldens_render_as_derived() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../goldens/dsml");
    let mut inputs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        // `*.provenance.json` sidecars describe the goldens; they are not cases.
        .filter(|p| !p.to_string_lossy().ends_with(".provenance.json"))
        .collect();
    inputs.sort();
    let mut failures = Vec::new();
    let (mut prompts, mut errors) = (0, 0);
    for input in &inputs {
        let name = input.file_stem().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(input).unwrap();
        let result = dsml::load_case(&text).and_then(|case| {
            dsml::render(&case.conversation, &case.options(ThinkingMode::Chat, None))
        });
        let txt = input.with_extension("txt");
        let err = input.with_extension("error");
        if txt.exists() {
            prompts += 1;
            let want = std::fs::read_to_string(&txt).unwrap();
            match result {
                Ok(p) if p.to_string() == want => {}
                Ok(p) => failures.push(format!(
                    "{name}:\n got {:?}\nwant {:?}",
                    p.to_string(),
                    want
                )),
                Err(e) => failures.push(format!("{name}: unexpected error {e}")),
            }
        } else if err.exists() {
            errors += 1;
            let want = std::fs::read_to_string(&err).unwrap();
            match result {
                Err(e) if e.reference_error().as_deref() == Some(want.as_str()) => {}
                other => failures.push(format!("{name}: got {other:?}, want error {want}")),
            }
        } else {
            failures.push(format!("{name}: no .txt or .error beside it"));
        }
    }
    eprintln!(
        "dsml goldens: {prompts} prompts, {errors} rejections, {} failures",
        failures.len()
    );
    assert!(prompts >= 30, "only {prompts} prompt goldens");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
