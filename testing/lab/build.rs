// Generates the lab's CSI node plugin's gRPC services (proto/). Needs `protoc` (Debian's
// protobuf-compiler; `make setup` installs it).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .compile_protos(&["proto/csi.proto"], &["proto"])?;
    Ok(())
}
