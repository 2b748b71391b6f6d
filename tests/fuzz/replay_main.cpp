// Replays a fuzz target's corpus without libFuzzer: every file under the given paths is fed to
// LLVMFuzzerTestOneInput once. ctest runs this on each target's seed corpus on every build, so
// inputs that once crashed stay fixed; `make fuzz` builds the same targets with libFuzzer.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size);
extern "C" int LLVMFuzzerInitialize(int * argc, char *** argv) __attribute__((weak));

int main(int argc, char ** argv) {
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    namespace fs = std::filesystem;
    std::vector<fs::path> files;
    for (int i = 1; i < argc; ++i) {
        const fs::path p = argv[i];
        if (fs::is_directory(p)) {
            for (const auto & de : fs::recursive_directory_iterator(p)) {
                if (de.is_regular_file()) files.push_back(de.path());
            }
        } else {
            files.push_back(p);
        }
    }
    if (files.empty()) {
        std::fprintf(stderr, "no corpus files given\n");
        return 2;
    }
    for (const auto & f : files) {
        std::ifstream in(f, std::ios::binary);
        const std::string bytes{std::istreambuf_iterator<char>(in), {}};
        LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size());
    }
    std::printf("replayed %zu inputs\n", files.size());
    return 0;
}
