//! The server's handle: spawning the acceptor and the worker pool, stats, and shutdown on drop.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::accept::accept_conn;
use super::worker::worker;
use super::{
    ACCEPT_POLL, AcceptCtx, Budget, Fatal, RdmaServer, Recovery, ServerStats, StatsSnapshot, WorkerHandle, cq_per_conn,
};
use crate::pool::{IoPool, PoolConfig};
use crate::server::Registry;
use crate::transport::RdmaConfig;
use crate::transport::backchannel::{self, Backchannel};
use verbs::Device;

impl RdmaServer {
    /// Listen on `addr` of `dev` and serve `registry` until dropped.
    ///
    /// [`RdmaConfig::workers`] threads serve every connection (each owns one completion
    /// queue that its connections' QPs share, and sleeps in it while nothing arrives); one
    /// more thread accepts connections, up to [`RdmaConfig::max_connections`].
    pub fn spawn(
        dev: &Device,
        addr: SocketAddr,
        registry: Arc<Registry>,
        cfg: RdmaConfig,
    ) -> Result<RdmaServer, verbs::Error> {
        let listener = dev.listen(addr)?;
        let addr = listener.local_addr();
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(ServerStats::default());
        let recovery = Arc::new(Recovery::default());
        let budget = Arc::new(Budget {
            used: AtomicU64::new(0),
            max: cfg.max_staging,
        });
        let live = Arc::new(AtomicUsize::new(0));
        let conns: Arc<Mutex<Vec<std::sync::Weak<backchannel::Shared>>>> = Arc::default();
        let nworkers = cfg.workers.max(1);
        let credits = cfg.credits.max(1);
        let per_worker = cfg.max_connections.max(1).div_ceil(nworkers);
        let mut workers = Vec::new();
        let mut threads = Vec::new();
        for i in 0..nworkers {
            // room for every completion its connections can have outstanding, and the wake-ups
            let cq = dev.create_cq(per_worker * cq_per_conn(credits) + 64)?;
            let w = Arc::new(WorkerHandle {
                cq,
                inbox: Mutex::new(Vec::new()),
                done: Mutex::new(Vec::new()),
                load: AtomicUsize::new(0),
            });
            let (w2, stop2, live2, idle) = (w.clone(), stop.clone(), live.clone(), cfg.idle_timeout);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("rpcrdma-worker-{i}"))
                    .spawn(move || worker(&w2, &stop2, &live2, idle))
                    .map_err(verbs::Error::Io)?,
            );
            workers.push(w);
        }
        let pool = match &cfg.pool {
            Some(p) => p.clone(),
            None => IoPool::new("rpcrdma-io", PoolConfig::with_threads(cfg.io_workers)).map_err(verbs::Error::Io)?,
        };
        let ctx = AcceptCtx {
            registry,
            pool,
            cfg,
            recovery,
            stats: stats.clone(),
            budget,
            conns: conns.clone(),
        };
        let (stop2, dev, workers2) = (stop.clone(), dev.clone(), workers.clone());
        let accept = std::thread::Builder::new()
            .name("rpcrdma-accept".into())
            .spawn(move || {
                while !stop2.load(Ordering::Relaxed) {
                    let Ok(req) = listener.get_request(Some(ACCEPT_POLL)) else {
                        continue;
                    };
                    let peer = req.peer_addr();
                    if live.load(Ordering::Acquire) >= ctx.cfg.max_connections {
                        // the connection cap: refuse at the CM level (no private data: RFC 8797
                        // defines none for a reject), and say so
                        tracing::warn!(%peer, cap = ctx.cfg.max_connections, "rpcrdma server: connection refused: at the connection cap");
                        ctx.stats.refused.fetch_add(1, Ordering::Relaxed);
                        let _ = req.reject(&[]);
                        continue;
                    }
                    let w = workers2
                        .iter()
                        .min_by_key(|w| w.load.load(Ordering::Relaxed))
                        .expect("at least one worker");
                    let accepted = dev
                        .alloc_pd()
                        .map_err(Fatal::from)
                        .and_then(|pd| accept_conn(req, &pd, w, &ctx));
                    match accepted {
                        Ok(c) => {
                            live.fetch_add(1, Ordering::AcqRel);
                            w.load.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(%peer, qp = c.qpn, "rpcrdma server: connection accepted");
                            w.inbox.lock().unwrap().push(c);
                            w.wake();
                        }
                        Err(e) => tracing::info!(%peer, "rpcrdma server: accept failed: {e}"),
                    }
                }
            })
            .map_err(verbs::Error::Io)?;
        Ok(RdmaServer {
            addr,
            conns,
            stop,
            stats,
            workers,
            accept: Some(accept),
            threads,
        })
    }
    /// The listening address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Handles for RFC 8167 reverse-direction calls, one per open connection (oldest first).
    pub fn backchannels(&self) -> Vec<Backchannel> {
        let mut g = self.conns.lock().unwrap();
        g.retain(|w| w.upgrade().is_some_and(|s| !s.closed.load(Ordering::Acquire)));
        g.iter().filter_map(|w| w.upgrade()).map(Backchannel).collect()
    }

    /// Counters.
    pub fn stats(&self) -> &ServerStats {
        &self.stats
    }

    /// A copy of the counters.
    pub fn snapshot(&self) -> StatsSnapshot {
        let s = &self.stats;
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            replies: g(&s.replies),
            rdma_errors: g(&s.rdma_errors),
            dropped: g(&s.dropped),
            fatal: g(&s.fatal),
            remote_invalidations: g(&s.remote_invalidations),
            connections: g(&s.connections),
            calls_short: g(&s.calls_short),
            calls_chunked: g(&s.calls_chunked),
            calls_long: g(&s.calls_long),
            replies_inline: g(&s.replies_inline),
            replies_write_chunks: g(&s.replies_write_chunks),
            replies_long: g(&s.replies_long),
            refused: g(&s.refused),
            idle_closed: g(&s.idle_closed),
            timeouts: g(&s.timeouts),
            short_reads: g(&s.short_reads),
            no_stage: g(&s.no_stage),
            copied_octets: g(&s.copied_octets),
            pool_wakeups: g(&s.pool_wakeups),
            replies_left_to_poster: g(&s.replies_left_to_poster),
        }
    }
}

impl Drop for RdmaServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for w in &self.workers {
            w.wake();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
