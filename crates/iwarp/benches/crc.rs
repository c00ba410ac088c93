//! CRC32c throughput: the MPA trailer must be nearly free next to kernel TCP.
//! `cargo bench -p iwarp --bench crc` (the issue asks for >= 20 GB/s at 64 KiB).
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("crc32c");
    for size in [64usize, 1460, 4096, 65536, 1 << 20] {
        let buf: Vec<u8> = (0..size).map(|i| (i * 131 % 251) as u8).collect();
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_function(format!("iwarp::crc::crc32c/{size}"), |b| {
            b.iter(|| iwarp::crc::crc32c(black_box(&buf)))
        });
        g.bench_function(format!("crc32c-crate/{size}"), |b| {
            b.iter(|| crc32c::crc32c(black_box(&buf)))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
