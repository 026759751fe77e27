#![no_main]
// See fuzz/README.md; the harness is ratekeeper::fuzzing::stats_mapping.
libfuzzer_sys::fuzz_target!(|data: &[u8]| ratekeeper::fuzzing::stats_mapping(data));
