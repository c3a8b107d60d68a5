#include "framework/file_store.hpp"
