//! The end-to-end suite: one test binary (linking the engine once) with a module per area.
//! Run one area with `cargo test --release -p voidbox-tests --test suite -- vm_network::`.

mod apply_cli;
mod apply_refusals;
mod cli;
mod cli_edges;
mod corpus;
mod doctor_cli;
mod export_engines;
mod image_cache;
mod image_registry;
mod lsp_neovim;
mod module_layers;
mod oci_cli;
mod readme_workflow;
mod release_bundle;
mod remote_skills;
mod runtimes_cli;
mod shell_cli;
mod skills_cli;
mod spec_contracts;
mod vm_agents;
mod vm_apply;
mod vm_artifacts;
mod vm_distributed;
mod vm_failures;
mod vm_images;
mod vm_network;
mod vm_observe;
mod vm_plain_tcg;
mod vm_policy;
mod vm_run;
mod vm_sandbox;
mod vm_services;
mod vm_shares;
mod vm_snapshot;
mod vm_xstate;
