//! Kizuna's gateway: a thin HTTP front over the SQL pack. It checks the token, runs each request in
//! one transaction as the caller, and adds what SQL cannot: CORS, body limits, wake-ups over
//! Server-Sent Events, metrics and static files for the demo. The semantics live in the pack.

pub mod app;
pub mod config;
pub mod db;
pub mod errors;
pub mod figures;
pub mod jwt;
pub mod limits;
pub mod metrics;
pub mod pack;
pub mod routes;
pub mod universe;
pub mod wake;
