//! The CDC message (type 0xFE, RFC 7609 §3.4, A.4).
