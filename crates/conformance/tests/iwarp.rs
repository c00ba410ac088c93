//! The conformance suite on the iWARP provider (`iwarp`, siw_soft0 devices),
//! connected with the rdma_cm-style CM; device variants CRC off (0) and on (1).

use conformance::*;
use proptest::prelude::*;

static FX: fixtures::Iwarp = fixtures::Iwarp { net: 131 };

conformance::tests! { FX;
    send_recv_write_read_rdmap_snd_01_wr_02_rd_01 => ops::send_recv_write_read;
    atomics_and_immediate_rfc7306 => ops::atomics_and_immediate;
    large_write_and_read_each_variant => ops::large_write_and_read;
    a_busy_poller_that_goes_away_leaves_no_stall => ops::busy_poller_that_goes_away_leaves_no_stall;
    read_without_remote_read_rdmap_sec_05 => access::read_without_remote_read;
    write_without_remote_write_rdmap_sec_05 => access::write_without_remote_write;
    read_past_end_rdmap_sec_03 => access::read_past_end;
    write_below_base_rdmap_sec_03 => access::write_below_base;
    atomic_without_remote_atomic_rdmap_sec_05 => access::atomic_without_remote_atomic;
    one_gib_by_writes_crc_off_rdmap_wr_02 => volume::one_gib, 0, false;
    one_gib_by_writes_crc_on => volume::one_gib, 1, false;
    one_gib_by_reads_crc_off_rdmap_rd_06 => volume::one_gib, 0, true;
    one_gib_by_reads_crc_on => volume::one_gib, 1, true;
    qps_256_at_once => volume::qps_256_at_once;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_mix_matches_model(ops in prop::collection::vec(model::op(), 1..48), variant in 0usize..2) {
        model::run(&FX, &ops, variant)?;
    }
}
