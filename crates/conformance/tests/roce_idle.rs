//! Idle cost on the RoCEv2 provider, in its own binary so nothing else runs
//! in the process while it measures.

use conformance::*;

static FX: fixtures::Roce = fixtures::Roce::new(134);

conformance::tests! { FX;
    sixty_four_idle_connections_use_no_cpu => idle::sixty_four_idle_connections_use_no_cpu;
}
