//! CLC messages (RFC 7609 A.2) in RFC 7609's v1 form and in Linux's v1/v2 forms.
