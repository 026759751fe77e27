#![no_main]
// See fuzz/README.md; the harness is ratekeeper::fuzzing::inject_yaml.
libfuzzer_sys::fuzz_target!(|data: &[u8]| ratekeeper::fuzzing::inject_yaml(data));
