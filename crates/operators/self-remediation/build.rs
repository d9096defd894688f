// Generates the peer-protocol code. Needs `protoc` (Debian's protobuf-compiler; `make setup`
// installs it).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(
            &["proto/peerhealth.proto", "proto/licence.proto", "proto/detection.proto"],
            &["proto"],
        )?;
    Ok(())
}
