#include "apps/ddp_run.hpp"

int main(int argc, char** argv) { return ddpRunMain(argc, argv); }
