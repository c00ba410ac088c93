//! The conformance suite on the iWARP provider (`iwarp`, siw_soft0 devices),
//! connected with the rdma_cm-style CM; device variants CRC off (0) and on (1).

use conformance::*;

static FX: fixtures::Iwarp = fixtures::Iwarp { net: 131 };

conformance::shared_suite!(FX);

// The 1 GiB transfers, named by the provider's two device variants.
conformance::tests! { FX;
    one_gib_by_writes_crc_off_rdmap_wr_02 => volume::one_gib, 0, false;
    one_gib_by_writes_crc_on => volume::one_gib, 1, false;
    one_gib_by_reads_crc_off_rdmap_rd_06 => volume::one_gib, 0, true;
    one_gib_by_reads_crc_on => volume::one_gib, 1, true;
}
