// A vector of trivially copyable elements that keeps the first N in place: work requests
// carry a few SGEs and a few inline bytes, and posting one must not cost a heap allocation.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <type_traits>

namespace softverbs {

template <typename T, size_t N>
class SmallVec {
  static_assert(std::is_trivially_copyable_v<T>, "elements are copied as bytes");

 public:
  SmallVec() = default;
  SmallVec(const SmallVec& o) { assign(o.data(), o.size_); }
  SmallVec(SmallVec&& o) noexcept { take(o); }
  SmallVec& operator=(const SmallVec& o) {
    if (this != &o) assign(o.data(), o.size_);
    return *this;
  }
  SmallVec& operator=(SmallVec&& o) noexcept {
    if (this != &o) {
      heap_.reset();
      cap_ = N;
      take(o);
    }
    return *this;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* data() { return heap_ ? heap_.get() : inline_; }
  const T* data() const { return heap_ ? heap_.get() : inline_; }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }

  void clear() { size_ = 0; }
  void reserve(size_t n) {
    if (n <= cap_) return;
    auto bigger = std::make_unique_for_overwrite<T[]>(n);
    if (size_) std::memcpy(bigger.get(), data(), size_ * sizeof(T));
    heap_ = std::move(bigger);
    cap_ = n;
  }
  // New elements are left uninitialised: callers overwrite them.
  void resize(size_t n) {
    reserve(n);
    size_ = n;
  }
  void push_back(const T& v) {
    if (size_ == cap_) reserve(cap_ * 2);
    data()[size_++] = v;
  }

 private:
  void assign(const T* src, size_t n) {
    resize(n);
    if (n) std::memcpy(data(), src, n * sizeof(T));
  }
  void take(SmallVec& o) {
    if (o.heap_) {
      heap_ = std::move(o.heap_);
      cap_ = o.cap_;
    } else if (o.size_) {
      std::memcpy(inline_, o.inline_, o.size_ * sizeof(T));
    }
    size_ = o.size_;
    o.size_ = 0;
    o.cap_ = N;
  }

  size_t size_ = 0;
  size_t cap_ = N;
  std::unique_ptr<T[]> heap_;
  T inline_[N];
};

}  // namespace softverbs
