//! The SMC-R TCP experimental option (RFC 7609 §3.1, A.1; kind 254, magic 0xE2D4C3D9).
