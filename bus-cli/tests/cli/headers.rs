//! `--header NAME=VALUE` (C25): on one value and on every stdin line, shown
//! by `fetch`, `tail` and `consume`; a bad header stores nothing.

use serde_json::json;

use crate::support::*;

#[test]
fn headers_travel_with_one_value_and_with_every_stdin_line() {
    let dir = provisioned();
    let one = ok(
        &dir,
        &[
            "publish",
            "one",
            "--key",
            "k",
            "--header",
            "ce_type=agent.started",
            "--header",
            "note=a=b, ünï",
            "{\"n\":0}",
        ],
        None,
    );
    assert_eq!(json_lines(&one)[0]["offset"], 0, "{one}");
    let streamed = ok(
        &dir,
        &[
            "publish",
            "one",
            "--key",
            "k",
            "--header",
            "ce_type=agent.step",
            "--batch-lines",
            "2",
        ],
        Some("{\"n\":1}\n{\"n\":2}\n\n{\"n\":3}\n"),
    );
    let acks = json_lines(&streamed);
    assert_eq!(acks.len(), 3, "{streamed}");
    assert_eq!(acks[2]["line"], 4);
    ok(&dir, &["publish", "one", "--key", "k", "{\"n\":4}"], None);

    let first = json!({"ce_type": "agent.started", "note": "a=b, ünï"});
    let step = json!({"ce_type": "agent.step"});
    let expected = [&first, &step, &step, &step];
    for (command, args) in [
        ("fetch", &["fetch", "one"][..]),
        ("tail", &["tail", "one"]),
        ("consume", &["consume", "one", "--as", "reader"]),
    ] {
        let lines = json_lines(&ok(&dir, args, None));
        assert_eq!(lines.len(), 5, "{command}: {lines:?}");
        for (i, line) in lines.iter().enumerate() {
            assert_eq!(line["value"]["n"], i, "{command}: {line}");
            match expected.get(i) {
                Some(headers) => assert_eq!(&line["headers"], *headers, "{command}: {line}"),
                None => assert!(line.get("headers").is_none(), "{command}: {line}"),
            }
        }
    }
}

#[test]
fn a_bad_header_is_exit_2_before_anything_is_stored() {
    let dir = provisioned();
    for header in ["bus-uid=forged", "no-equals-sign", "=empty-name", "naïve=1"] {
        for stdin in [None, Some("{\"n\":1}\n")] {
            let args = ["publish", "one", "--key", "k", "--header", header];
            let args: Vec<&str> = match stdin {
                None => args.iter().copied().chain(["{\"n\":1}"]).collect(),
                Some(_) => args.to_vec(),
            };
            let result = run(&dir, &args, stdin);
            assert_eq!(result.code, 2, "{header} {stdin:?}: {}", result.stderr);
            assert!(result.stderr.contains("header"), "{}", result.stderr);
        }
    }
    assert!(
        ok(&dir, &["fetch", "one"], None).is_empty(),
        "nothing stored"
    );
}
