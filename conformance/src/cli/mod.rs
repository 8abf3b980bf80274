//! One module per `ds41` subcommand. Each exposes `Args` (clap) and
//! `run(Args) -> anyhow::Result<i32>` returning the process exit code.

pub mod bench;
pub mod certify;
pub mod convert;
pub mod corpus;
pub mod dspark;
pub mod forward;
pub mod gate;
pub mod gate_converter;
pub mod goldens;
pub mod inspect;
pub mod parse;
pub mod preprocess;
pub mod render;
pub mod serve_adapter;
pub mod synth;
pub mod tokenize;
pub mod verify_certificate;
