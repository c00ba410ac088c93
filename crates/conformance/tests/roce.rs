//! The conformance suite on the RoCEv2 provider (`roce`, rxe_soft0-like devices),
//! connected by hand with modify_qp; device variants port MTU 1024 (0) and 4096 (1).

use conformance::*;

static FX: fixtures::Roce = fixtures::Roce::new(133);

conformance::shared_suite!(FX);

// The 1 GiB transfers, named by the provider's two device variants.
conformance::tests! { FX;
    one_gib_by_writes_mtu_1024_rdmap_wr_02 => volume::one_gib, 0, false;
    one_gib_by_writes_mtu_4096 => volume::one_gib, 1, false;
    one_gib_by_reads_mtu_1024_rdmap_rd_06 => volume::one_gib, 0, true;
    one_gib_by_reads_mtu_4096 => volume::one_gib, 1, true;
}
