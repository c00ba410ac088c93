//! Traceability for issue 2 ("the iWARP wire layer, exact to the RFCs and to
//! Linux siw"): every point of its "What must hold" list, the requirement
//! IDs of `shared/requirements/rdmap-rpcrdma.md` it maps to, and the tests
//! that cover it. The test below fails if a listed test is renamed or
//! removed, so the table cannot silently go stale.
//!
//! IDs: RDMAP-… are catalogue Part A rows; the catalogue has no MPA-/DDP-
//! IDs, so MPA and DDP points cite their catalogue sections (C.1.x DDP,
//! C.2.x MPA, C.3 RFC 6581), matrix rows ("row N" = A.4.6) and Part D IDs
//! (SEC-…).

/// (point of issue 2, requirement IDs, file under `crates/iwarp`, test fns).
const TABLE: &[(&str, &str, &str, &[&str])] = &[
    // ---- golden byte vectors -------------------------------------------------
    (
        "golden: MPA v2 Request and Reply as Linux siw emits them",
        "C.2.2 C.3",
        "src/wire/mpa.rs",
        &[
            "deconstruct_siw_request",
            "parse_siw_request_and_reply",
            "emit_siw_request_and_reply",
            "siw_marker_reject_reply",
            "rev1_request_and_reply",
            "crc_request",
            "keys_match_rfc5044_fig8",
        ],
    ),
    (
        "golden: our MPA state machine sends siw's frames and answers them like siw",
        "C.2.1 C.3",
        "src/proto/mpa_tests.rs",
        &[
            "initiator_default_request_is_siws",
            "responder_answers_siw_request_like_siw",
            "initiator_takes_siw_reply",
        ],
    ),
    (
        "golden: CRC32c check value, RFC 3720 vectors, LSB-first wire order",
        "C.2.5",
        "src/crc.rs",
        &["check_value", "rfc3720_vectors"],
    ),
    (
        "golden: FPDUs of RFC 5044 Figs. 5/6 (CRC, markers) and siw's CRC-off FPDU",
        "C.2.4 C.2.5 C.2.6",
        "src/wire/fpdu.rs",
        &[
            "crc_check_value",
            "rfc5044_fig5_first_fpdu_with_marker",
            "rfc5044_fig6_second_fpdu_with_inner_marker",
            "siw_golden_fpdu_crc_off",
            "fig5_without_marker_crc_off_matches_siw_shape",
        ],
    ),
    (
        "golden: DDP headers from a Linux siw capture",
        "C.1.1 RDMAP-HDR-01 RDMAP-LLP-03",
        "src/wire/ddp_tests.rs",
        &[
            "siw_capture_send",
            "siw_capture_read_request",
            "siw_capture_read_response_and_write",
            "siw_captures_round_trip",
        ],
    ),
    (
        "golden: every RDMAP opcode (RFC 5040 and RFC 7306)",
        "RDMAP-HDR-01 RDMAP-HDR-02 RDMAP-HDR-08 RDMAP-RD-02 RDMAP-SND-01 RDMAP-TRM-01",
        "src/wire/rdmap_tests.rs",
        &[
            "golden_control_words",
            "siw_send",
            "siw_read_request",
            "siw_read_response_and_write",
            "rfc_send_with_invalidate_variants",
            "rfc7306_immediate_data",
            "atomic_request_bytes",
            "rfc7306_atomic_request",
            "rfc7306_atomic_response",
            "terminate_message",
        ],
    ),
    (
        "golden: Terminate size classes 22/38/42/70, RFC and siw bit forms",
        "RDMAP-HDR-10 RDMAP-HDR-12 A.1.4",
        "src/wire/terminate_tests.rs",
        &[
            "size_classes",
            "golden_22",
            "golden_38",
            "golden_42",
            "golden_70",
            "control_word_forms_brief_example",
            "siw_r_without_rdma_header",
        ],
    ),
    (
        "independent decoder: tshark reads every message of our encoders",
        "RDMAP-HDR-01..04 RDMAP-HDR-08..10 RDMAP-LLP-02 RDMAP-STR-01 C.2.2 C.2.5 C.3",
        "tests/tshark_pcap.rs",
        &["tshark_decodes_every_message_we_emit", "tshark_gate_catches_a_bad_crc"],
    ),
    // ---- round trips --------------------------------------------------------
    (
        "round trip: MPA Request/Reply and the RFC 6581 block",
        "C.2.2 C.3",
        "src/wire/mpa.rs",
        &["roundtrip", "enhanced_roundtrip"],
    ),
    (
        "round trip: FPDU framing and CRC",
        "C.2.4 C.2.5",
        "src/wire/fpdu.rs",
        &[
            "view_roundtrip",
            "begin_trailer_matches_emit",
            "gather_equals_contiguous",
        ],
    ),
    (
        "round trip: CRC32c against an independent crate",
        "C.2.5",
        "src/crc.rs",
        &["matches_oracle"],
    ),
    (
        "round trip: DDP headers",
        "C.1.1 RDMAP-LLP-03",
        "src/wire/ddp_tests.rs",
        &["header_round_trip"],
    ),
    (
        "round trip: RDMAP messages and fixed headers",
        "RDMAP-LLP-03 RDMAP-HDR-08",
        "src/wire/rdmap_tests.rs",
        &[
            "message_round_trip",
            "read_request_header_round_trip",
            "atomic_headers_round_trip",
        ],
    ),
    (
        "round trip: Terminate header in both forms",
        "RDMAP-HDR-10 RDMAP-HDR-11 RDMAP-HDR-12",
        "src/wire/terminate_tests.rs",
        &[
            "round_trip_explicit_form",
            "round_trip_detected",
            "control_word_bijective",
        ],
    ),
    // ---- streams split anywhere, reassembly ---------------------------------
    (
        "deframer: stream split at every offset, byte at a time, random splits",
        "C.2.4 E.2",
        "src/wire/fpdu_deframer.rs",
        &["every_split_offset_all_modes", "byte_at_a_time", "random_splits"],
    ),
    (
        "MPA negotiation: frames split at every offset",
        "C.2.1 RDMAP-STR-01",
        "src/proto/mpa_tests.rs",
        &["every_split_offset", "rdmap_str_01_consumes_exactly_the_frame"],
    ),
    (
        "DDP segmentation and reassembly at any MULPDU",
        "C.1.2 C.1.3 RDMAP-LLP-02 RDMAP-LLP-04 RDMAP-ORD-16",
        "src/wire/ddp_tests.rs",
        &["lengths_llp02_llp04", "any_mulpdu_reassembles", "zero_length_message"],
    ),
    (
        "DDP receive in the engine's core: reassembly, interleaving, MSN wrap, segmentation on the wire",
        "C.1.3 RDMAP-LLP-04 RDMAP-ORD-16 A.4.2",
        "src/engine/qp/core_tests.rs",
        &[
            "untagged_sequencing_and_reassembly",
            "segments_of_one_message_stay_together",
            "segmentation_on_the_wire_llp04",
            "direct_placement_in_memory",
        ],
    ),
    (
        "whole pipeline: every message, stream cut at every octet, with/without markers",
        "E.2 C.2.4 C.2.6 C.1.3 RDMAP-LLP-02..04",
        "tests/wire_stream.rs",
        &["every_split_offset_gives_back_every_message"],
    ),
    // ---- errors name their Terminate ----------------------------------------
    (
        "CRC errors -> 2/0/0x02",
        "row 26 C.2.7",
        "src/wire/fpdu_deframer.rs",
        &[
            "crc_error_names_mpa_err_crc",
            "single_bit_flip_detected_with_crc",
            "crc_off_ignores_crc_field",
        ],
    ),
    (
        "corruption at any octet of a stream is a typed error",
        "row 26 SEC-ROB-01",
        "tests/wire_stream.rs",
        &["corruption_anywhere_is_a_typed_error_row_26"],
    ),
    (
        "bad lengths, markers and bounded buffers",
        "C.2.4 C.2.7 row 27 SEC-DOS-05",
        "src/wire/fpdu_deframer.rs",
        &[
            "bad_ulpdu_length",
            "marker_pointer_mismatch",
            "sec_dos_05_largest_fpdu_and_bounded_buffer",
        ],
    ),
    (
        "bad DDP versions (rows 6, 7) and truncated DDP headers",
        "C.1.4 row 6 row 7",
        "src/wire/ddp_tests.rs",
        &[
            "bad_dv_untagged_row6",
            "bad_dv_tagged_row7",
            "dv_checked_before_length",
            "truncated_empty",
            "truncated_tagged_header",
            "truncated_untagged_header",
        ],
    ),
    (
        "bad RDMAP version, unknown opcode, T/QN mismatch, bad header lengths, bad Terminate",
        "row 5 row 21 row 22 row 24 RDMAP-HDR-04 RDMAP-HDR-07 RDMAP-TRM-04",
        "src/wire/rdmap_tests.rs",
        &[
            "malformed_bad_rv_row21",
            "malformed_unknown_opcode_row22",
            "malformed_opcode_t_mismatch_row24",
            "malformed_opcode_qn_mismatch_row5",
            "malformed_read_request_trailing_payload",
            "malformed_read_request_truncated",
            "malformed_header_only_message_not_last",
            "malformed_immediate_length",
            "malformed_terminate",
        ],
    ),
    (
        "truncated or inconsistent Terminates; which headers each cause echoes",
        "RDMAP-HDR-12 RDMAP-ERR-02..04 A.1.7 A.5 #1-#3",
        "src/wire/terminate_tests.rs",
        &[
            "malformed_truncated_control",
            "malformed_d_without_ddp_header",
            "malformed_r_without_rdma_header_rfc",
            "malformed_m_without_d",
            "malformed_trailing_bytes",
            "builder_ddp_untagged_rows_1_to_5",
            "builder_ddp_tagged_rows_8_to_12",
            "builder_read_request_rows_13_to_19",
            "builder_layout_unknown",
        ],
    ),
    (
        "DDP receive checks in the engine's core, one per matrix row and per Terminate cause",
        "rows 1-29 C.1.4 RDMAP-SND-01 RDMAP-ERR-02..07",
        "src/engine/qp/core_tests.rs",
        &[
            "every_terminate_row_is_reachable_in_memory",
            "every_terminate_cause_the_engine_emits_is_reached",
        ],
    ),
    (
        "MPA negotiation failures name their error",
        "C.2.1 C.2.7 C.3 SEC-DOS-05 SEC-DOS-06",
        "src/proto/mpa_tests.rs",
        &[
            "bad_key_refused_early",
            "bad_revision",
            "sec_dos_05_private_data_too_long_from_peer",
            "sec_dos_06_stalled_request_times_out",
            "rtr_no_match",
            "ird_ord_insufficient_at_initiator",
        ],
    ),
    (
        "no panic on any input",
        "SEC-ROB-01",
        "src/wire/rdmap_tests.rs",
        &["parse_never_panics"],
    ),
    (
        "no panic on any input",
        "SEC-ROB-01",
        "src/wire/ddp_tests.rs",
        &["parse_never_panics"],
    ),
    (
        "no panic on any input",
        "SEC-ROB-01",
        "src/wire/terminate_tests.rs",
        &["parse_never_panics"],
    ),
    (
        "no panic on any input",
        "SEC-ROB-01",
        "src/wire/mpa.rs",
        &["parse_never_panics"],
    ),
    (
        "no panic on any input",
        "SEC-ROB-01",
        "src/wire/fpdu_deframer.rs",
        &["garbage_never_panics"],
    ),
    (
        "no panic on any input",
        "SEC-ROB-01",
        "src/proto/mpa_tests.rs",
        &["arbitrary_peer_bytes_never_panic"],
    ),
];

/// One fuzz target per decoder (issue 2: MPA request/reply, FPDU deframer,
/// DDP, RDMAP, Terminate) and one on the QP protocol core the engine runs
/// (issue 11), run by `scripts/fuzz-smoke.sh`.
const FUZZ_TARGETS: &[&str] = &["mpa_frame", "fpdu_deframer", "ddp", "rdmap", "terminate", "qp_core"];

#[test]
fn every_listed_test_exists() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut missing = Vec::new();
    for (point, ids, file, tests) in TABLE {
        assert!(!ids.is_empty() && !point.is_empty());
        let src = std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        for t in *tests {
            if !src.contains(&format!("fn {t}(")) {
                missing.push(format!("{file}: fn {t} ({point}; {ids})"));
            }
        }
    }
    let fuzz = root.join("../../fuzz/fuzz_targets");
    for t in FUZZ_TARGETS {
        if !fuzz.join(format!("{t}.rs")).exists() {
            missing.push(format!("fuzz target {t}"));
        }
    }
    assert!(
        missing.is_empty(),
        "tests named by the issue 2 table are gone:\n{}",
        missing.join("\n")
    );
}
