//! The conformance suite against throwaway `etcd` servers with
//! `layout=etcd`: each case's locks under a namespace of its own (and its
//! fences under a prefix of its own) on one shared single-member server; a
//! server of its own for each case that restarts it.

use fencelock_testkit::{
    servers::{etcd::EtcdCluster, url_factory::UrlServer},
    TestResult,
};

pub struct EtcdLayout(EtcdCluster);

impl UrlServer for EtcdLayout {
    fn start_shared() -> TestResult<Self> {
        <EtcdCluster as UrlServer>::start_shared().map(Self)
    }
    fn start_dedicated() -> TestResult<Self> {
        <EtcdCluster as UrlServer>::start_dedicated().map(Self)
    }
    fn url(&self) -> String {
        self.0.url()
    }
    fn case_url(&self, case: usize) -> String {
        format!(
            "{}?layout=etcd&namespace=case{case}/&prefix=case{case}",
            self.url()
        )
    }
    fn restart_server(&self) -> TestResult {
        self.0.restart()
    }
}
