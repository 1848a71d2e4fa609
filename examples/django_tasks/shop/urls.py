from django.urls import path

from orders import views

urlpatterns = [path("orders", views.place_order), path("tasks/<str:task_id>", views.task_status)]
