#![no_main]
// See fuzz/README.md; the harness is ratekeeper::fuzzing::rlqs.
libfuzzer_sys::fuzz_target!(|data: &[u8]| ratekeeper::fuzzing::rlqs(data));
