#![no_main]
// See fuzz/README.md; the harness is ratekeeper::fuzzing::limits.
libfuzzer_sys::fuzz_target!(|data: &[u8]| ratekeeper::fuzzing::limits(data));
