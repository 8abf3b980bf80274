//! Vision preprocessing (MODEL.md §10.2) bit for bit against the official
//! `image_processor.load_image` on the project's PNG corpus, and the vision tower against the
//! official `vision.py`. The corpus (goldens/vision/preprocess/, made by
//! goldens/regen/vision_preprocess.py): every colour type and bit depth, interlaced files,
//! sizes from 1x1 to 100000x1, upscale, shrink, single row / column, pad-only and the
//! `max_wh_ratio` stretch.

use std::path::PathBuf;
use std::time::Instant;

use ds41_conformance::vision_goldens::{check_corpus, check_tower};

#[test]
fn preprocessing_equals_the_official_pipeline_on_the_png_corpus() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../goldens/vision/preprocess");
    let start = Instant::now();
    let report = check_corpus(&dir).unwrap();
    eprintln!(
        "{} images, {} cases, {} bit-exact (Pillow {}), {:.1} s",
        report.images,
        report.cases,
        report.exact,
        report.pillow,
        start.elapsed().as_secs_f64()
    );
    assert!(
        report.cases >= 70,
        "the corpus shrank: {} cases",
        report.cases
    );
    assert!(
        report.failures.is_empty(),
        "{} of {} cases differ from the official pipeline:\n{}",
        report.failures.len(),
        report.cases,
        report.failures.join("\n")
    );
}

/// The vision tower and aligner (both numerics profiles) against the official `vision.py`'s
/// outputs on small random weights (goldens/vision/tower/, goldens/regen/vision_tower.py).
#[test]
fn vision_tower_matches_the_official_goldens() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../goldens/vision");
    let report = check_tower(&root.join("tower"), &root.join("preprocess/images")).unwrap();
    eprintln!("{}", report.summary());
    assert_eq!(report.profiles.len(), 2);
    assert!(report.profiles.iter().all(|p| p.1 == 3), "{report:?}");
    assert!(report.failures.is_empty(), "{}", report.failures.join("\n"));
}
