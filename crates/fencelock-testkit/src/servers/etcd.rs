//! Throwaway `etcd` servers and clusters.
