//! Declares the fleet suite's modules: every `.rs` file in `tests/fleet/` besides `main.rs` is a
//! module of the one test binary, so a new test module is its file and nothing else.

use std::path::Path;

fn main() {
    let suite = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fleet");
    println!("cargo:rerun-if-changed={}", suite.display());
    let mut modules: Vec<String> = std::fs::read_dir(&suite)
        .expect("tests/fleet")
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter_map(|name| Some(name.strip_suffix(".rs")?.to_string()))
        .filter(|name| name != "main")
        .collect();
    modules.sort();
    let declarations: String = modules
        .iter()
        .map(|m| format!("#[path = {:?}]\nmod {m};\n", suite.join(format!("{m}.rs")).display().to_string()))
        .collect();
    let out = Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("fleet_modules.rs");
    std::fs::write(out, declarations).expect("the module list is written");
}
