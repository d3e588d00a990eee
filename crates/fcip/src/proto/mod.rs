//! sans-IO state machines.
