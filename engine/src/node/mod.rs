//! A node made ready to run, the same way for `apply`, `run` and `shell`: what voidbox
//! refuses before anything starts ([`refusals`], with the model endpoints [`reachable`]), the
//! guest policy ([`policy`]), OCI images and skills ([`oci_images`]), the agent runtime's launch
//! ([`launch`]) and an agent node's kit and report ([`agent`]); [`prepare`] runs the checks
//! in one pass; [`warm_launch`] is what runs warm (a runtime held waiting for its prompt).

pub mod agent;
pub mod command_runtimes;
pub mod launch;
pub mod oci_images;
pub mod policy;
pub mod prepare;
pub mod reachable;
pub mod refusals;
pub mod warm_launch;
pub mod warm_snapshot;
