//! LLC messages (RFC 7609 §3.3, A.3) in v1 and Linux's v2 form.
