//! Placeholder until the gateway lands.
