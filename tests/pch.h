// Precompiled header for the tests.
#pragma once
#include <gtest/gtest.h>
#include <ATen/ATen.h>
