// Linked with one layer's library whole (every object of it) and the layers below it only
// (CMakeLists.txt, layer_check_*): a call from the layer into one above it is an undefined symbol,
// and the build fails. Nothing runs this program.
int main() { return 0; }
