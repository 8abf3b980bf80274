//! Test switches for external data: see ../build-support/external_data_cfg.rs.
include!("../build-support/external_data_cfg.rs");

fn main() {
    external_data_cfg();
}
