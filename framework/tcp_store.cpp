#include "framework/tcp_store.hpp"
