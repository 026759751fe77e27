//! Compiles the protos under `proto/` with protox, a pure-Rust protobuf compiler, so a
//! fresh machine needs no system `protoc`: our own peer protocol, and the reference
//! service's `RateLimitConfig` xDS resource (messages only). Envoy's protos come from the
//! envoy-types crate.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/ratekeeper/peer/v1/peer.proto",
        "proto/ratelimit/config/ratelimit/v3/rls_conf.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
