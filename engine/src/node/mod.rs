//! A node made ready to run, the same way for `apply`, `run` and `shell`: what voidbox
//! refuses before anything starts ([`refusals`], with the model endpoints [`reachable`]), the
//! guest policy ([`policy`]), OCI images and skills ([`images`]), the agent runtime's launch
//! ([`launch`]) and an agent node's kit and report ([`agent`]); [`prepare`] runs the checks
//! in one pass.

pub mod agent;
pub mod images;
pub mod launch;
pub mod policy;
pub mod prepare;
pub mod reachable;
pub mod refusals;
