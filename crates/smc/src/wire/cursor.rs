//! RMB element cursors with wrap (RFC 7609 §4.2-4.3, A.4).
