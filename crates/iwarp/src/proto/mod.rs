//! Sans-I/O protocol state machines of the iWARP provider, driven by events
//! from the engine: [`mpa`] (connection setup negotiation, RFC 5044 §7 and
//! RFC 6581), [`segment`] (DDP segmentation, RFC 5041 §5), [`ddp_rx`]
//! (DDP receive-side checks and untagged reassembly, RFC 5041 §5-§7).

pub mod ddp_rx;
pub mod mpa;
pub mod segment;
