//! WASTE v0 container (CONTAINER.md §1–§8). Placeholder while the release reader lands.
use super::{Checkpoint, Layout, QuantView, Storage};
use crate::config::{Config, EngramHashConstants};
use crate::{Error, Result};
use std::path::Path;

pub struct ContainerCheckpoint {
    config: Config,
}

impl ContainerCheckpoint {
    pub fn open(dir: &Path) -> Result<Self> {
        let _ = dir;
        Err(Error::Model("container reader not implemented yet".into()))
    }
}

impl Checkpoint for ContainerCheckpoint {
    fn layout(&self) -> Layout {
        Layout::Container
    }
    fn config(&self) -> &Config {
        &self.config
    }
    fn contains(&self, _: &str) -> bool {
        false
    }
    fn names(&self) -> Vec<String> {
        vec![]
    }
    fn shape(&self, _: &str) -> Result<Vec<usize>> {
        unimplemented!()
    }
    fn storage(&self, _: &str) -> Result<Storage> {
        unimplemented!()
    }
    fn tensor_f32(&self, _: &str) -> Result<Vec<f32>> {
        unimplemented!()
    }
    fn rows_f32(&self, _: &str, _: usize, _: &mut [f32]) -> Result<()> {
        unimplemented!()
    }
    fn quant_view(&self, _: &str) -> Result<Option<QuantView<'_>>> {
        Ok(None)
    }
    fn engram_constants(&self) -> Result<EngramHashConstants> {
        unimplemented!()
    }
    fn engram_token_map(&self) -> Result<Option<Vec<i32>>> {
        Ok(None)
    }
}
