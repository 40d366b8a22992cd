//! The control plane behind one trait (etcd and embedded). Arrives with the single-node and etcd issues.
