//! RoCEv2 wire formats: InfiniBand transport headers in UDP (IBTA vol. 1 ch. 9, annex A17).
