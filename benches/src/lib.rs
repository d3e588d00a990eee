//! Benchmarks live in benches/benches; this library holds what they share:
//! [`pages`], a deterministic generator of database-like 8 KiB pages (the
//! compression benchmarks' data set).

pub mod pages;
