//! The reference's vision requests (PROTOCOL.md `vision_preprocess`, `vision_tower`,
//! `vision_span`), on the engine's `vision` module.

use std::collections::BTreeMap;

use ds41_engine::model::DefectSet;
use ds41_engine::trace::{TraceFile, TraceTensor};
use ds41_engine::vision::patch_file::{patch_file_bytes, PatchFile};
use ds41_engine::vision::tower::{ForcedStages, VisionTower};

use crate::engine_api::*;

fn refused(e: ds41_engine::Error) -> EngineError {
    EngineError::Refused(e.to_string())
}

fn failed(e: ds41_engine::Error) -> EngineError {
    EngineError::Failed(e.to_string())
}

pub fn preprocess(req: &VisionPreprocessRequest) -> EngineResult<()> {
    let patches = ds41_engine::vision::load_image(&req.image, &req.config.vision_config())
        .map_err(refused)?;
    let bytes = patch_file_bytes(&patches, &BTreeMap::new()).map_err(failed)?;
    ds41_engine::state::write_atomic(&req.out, &bytes).map_err(failed)
}

/// The stage tensors of a tower request's replay file, as f32 rows.
struct Forced {
    embed: Vec<f32>,
    blocks: Vec<Vec<f32>>,
    vit: Vec<f32>,
}

fn read_forced(path: &std::path::Path, layers: usize) -> EngineResult<Forced> {
    let file = TraceFile::read(path).map_err(refused)?;
    let get = |name: &str| -> EngineResult<(Vec<usize>, Vec<f32>)> {
        file.f32(name)
            .map(|(s, v)| (s.to_vec(), v.to_vec()))
            .ok_or_else(|| {
                EngineError::Refused(format!("{}: no float tensor `{name}`", path.display()))
            })
    };
    let (shape, blocks) = get("vision.blocks")?;
    if shape.first() != Some(&layers) {
        return Err(EngineError::Refused(format!(
            "{}: `vision.blocks` has shape {shape:?}, the tower has {layers} blocks",
            path.display()
        )));
    }
    let per = blocks.len() / layers.max(1);
    Ok(Forced {
        embed: get("vision.embed")?.1,
        blocks: blocks.chunks(per.max(1)).map(<[f32]>::to_vec).collect(),
        vit: get("vision.norm")?.1,
    })
}

pub fn tower(req: &VisionTowerRequest, defects: DefectSet) -> EngineResult<()> {
    let ckpt = ds41_engine::checkpoint::open(&req.model).map_err(refused)?;
    let tower = VisionTower::from_checkpoint(ckpt.as_ref(), req.numerics)
        .map_err(refused)?
        .with_defects(defects);
    let patches = PatchFile::read(&req.patches).map_err(refused)?;
    if patches.patch_size != tower.config.patch_size {
        return Err(EngineError::Refused(format!(
            "{}: patches of {} pixels square for a tower with patch size {}",
            req.patches.display(),
            patches.patch_size,
            tower.config.patch_size
        )));
    }
    let forced = match &req.replay {
        Some(p) => Some(read_forced(p, tower.blocks.len())?),
        None => None,
    };
    let stages = forced.as_ref().map(|f| ForcedStages {
        embed: &f.embed,
        blocks: &f.blocks,
        vit: &f.vit,
    });
    let (n_h, n_w) = (patches.n_vit_h, patches.n_vit_w);
    let out = tower
        .run(&patches.patches, n_h, n_w, stages.as_ref())
        .map_err(refused)?;
    let (n, dim) = (n_h * n_w, tower.config.dim);
    let mut trace = TraceFile::default();
    let mut put = |name: &str, shape: Vec<usize>, v: Vec<f32>| {
        trace
            .tensors
            .insert(name.into(), TraceTensor::f32(shape, v));
    };
    put("vision.embed", vec![n, dim], out.embed);
    put(
        "vision.blocks",
        vec![out.blocks.len(), n, dim],
        out.blocks.concat(),
    );
    put("vision.norm", vec![n, dim], out.vit);
    let llm_dim = tower.aligner_w2.out_dim;
    put(
        "vision.aligner",
        vec![out.aligner.len() / llm_dim, llm_dim],
        out.aligner,
    );
    trace.write(&req.out).map_err(failed)
}

pub fn span(req: &VisionSpanRequest) -> EngineResult<VisionSpan> {
    let (vision, marker) =
        ds41_engine::vision::image_inputs_config_from(&req.model).map_err(refused)?;
    let tokenizer = ds41_engine::tokenizer::Tokenizer::from_file(req.model.join("tokenizer.json"))
        .map_err(refused)?;
    let prompt = tokenizer.encode_markup(&req.prompt);
    let images = req
        .images
        .iter()
        .map(|p| ds41_engine::vision::load_image(p, &vision))
        .collect::<ds41_engine::Result<Vec<_>>>()
        .map_err(refused)?;
    let (tokens, placed) =
        ds41_engine::vision::expand_markers(&prompt, marker, images).map_err(refused)?;
    let types = ds41_engine::vision::span::sequence_types(&tokens, marker, &placed)
        .map_err(failed)?
        .into_iter()
        .map(|t| t.code())
        .collect();
    Ok(VisionSpan {
        tokens,
        token_types: types,
    })
}
