//! Idle cost on the iWARP provider, in its own binary so nothing else runs
//! in the process while it measures.

use conformance::*;

static FX: fixtures::Iwarp = fixtures::Iwarp { net: 132 };

conformance::tests! { FX;
    sixty_four_idle_connections_use_no_cpu => idle::sixty_four_idle_connections_use_no_cpu;
}
