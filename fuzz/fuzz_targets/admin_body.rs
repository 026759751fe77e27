#![no_main]
// See fuzz/README.md; the harness is ratekeeper::fuzzing::admin_body.
libfuzzer_sys::fuzz_target!(|data: &[u8]| ratekeeper::fuzzing::admin_body(data));
