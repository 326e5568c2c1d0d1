//! What the embedded log's cold tier tests share.

/// The tier locations a test runs against: local files under `dir`, and the
/// S3 server when `BUS_S3_ENDPOINT` and `BUS_S3_BUCKET` are set (a loud
/// skip without, a failure when `BUS_REQUIRE_BROKERS=1`).
pub fn locations(dir: &std::path::Path) -> Vec<(String, String)> {
    let mut all = vec![(
        "local".to_owned(),
        format!("file://{}", dir.join("cold").display()),
    )];
    match (
        std::env::var("BUS_S3_ENDPOINT"),
        std::env::var("BUS_S3_BUCKET"),
    ) {
        (Ok(endpoint), Ok(bucket)) if !endpoint.is_empty() => {
            let prefix = format!("embedded-{}-{}", std::process::id(), bus_core::now_ms());
            all.push((
                "s3".to_owned(),
                format!("s3://{bucket}/{prefix}?endpoint={endpoint}"),
            ));
        }
        _ if std::env::var("BUS_REQUIRE_BROKERS").is_ok_and(|v| v == "1") => {
            panic!(
                "S3 required (BUS_REQUIRE_BROKERS=1): set BUS_S3_ENDPOINT and BUS_S3_BUCKET (scripts/seaweedfs.sh start)"
            )
        }
        _ => eprintln!(
            "\n*** SKIPPED the S3 case of a bus-embedded cold tier test: BUS_S3_ENDPOINT / BUS_S3_BUCKET not set ***\n"
        ),
    }
    all
}
